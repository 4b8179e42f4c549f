"""Value serialisation: pickle, JSON or msgpack, recorded in the item's flags, optionally signed.

A store turns every value into ``(bytes, flags)`` through a *serde* (pymemcache's
protocol).  The serde of our stores is a :class:`ValueSerde`: the serializer named
by ``OPTIONS["serializer"]`` (a dotted path), optional signing, and the read
guard that decides what happens to an item it will not decode.  The soft-expiry
envelope (:mod:`.envelope`, flag bit 16) wraps it.

Flags (memcached's 32-bit client flags) say what the bytes are, so a reader never
guesses::

    value            flags                 data                    serializers
    bytes            0                     the bytes               all (raw: append/prepend work)
    str              FLAG_TEXT   (1 << 4)  UTF-8                   all
    int              FLAG_INTEGER (1 << 1) decimal ASCII           all (incr/decr work)
    anything else    FLAG_PICKLE (1 << 0)  pickle                  PickleSerializer (the default)
                     FLAG_JSON   (1 << 17) JSON (ASCII)            JSONSerializer
                     FLAG_MSGPACK (1 << 18) msgpack                MsgpackSerializer
    signed           + FLAG_SIGNED (1 << 20), data = HMAC-SHA256 (32 bytes) + data

Bits 0-4 are pymemcache's ``pickle_serde`` layout, so :class:`PickleSerializer`
reads and writes exactly what Django's ``PyMemcacheCache`` does.  Bits 17-20 are
clear of those of pymemcache (0-4), pylibmc (0-5), spymemcached (0-1, 8-15) and
the envelope (16).  A ``str`` that is not valid Unicode (lone surrogates) cannot
be UTF-8 text and goes through the serializer's own format.

What a read does with an item it will not decode (the policy for values)
    A reader decodes bytes, text, integers and *its own* serializer's format,
    nothing else.  Another serializer's format, unknown flags, corrupt data (a
    bad pickle, bad JSON, invalid UTF-8), an unsigned or forged item under
    signing: each is **refused**.  The store answers a *miss* (``get`` returns
    the default, ``get_many`` leaves the key out, ``gets`` answers
    ``(None, None)``), logs a warning on ``django_mcpatterns.serializers``,
    counts it by reason (:meth:`ValueSerde.refusals`) and calls ``on_refused``
    with a :class:`ValueRefused` (Django and Flask send the ``value_refused``
    signal).  The item is left in place: on a ring shared with PHP, Java or
    pylibmc clients it is another client's value, and a delete (without
    ``cas``) could also take a fresh value written meanwhile.  ``set`` (and
    ``get_or_compute``, which stores with ``set``) replaces it; ``add`` and
    Django's ``get_or_set`` leave it and return their value uncached.  Never a
    silent ``None``, never a guess, never an unpickled stranger.  (Set and list
    items, and soft-expiry envelopes of an unknown version, raise
    :class:`~.exceptions.EncodingError` instead: there a miss would be a wrong
    answer.)
What a write does with a value it cannot encode
    Raise :class:`~.exceptions.EncodingError` (e.g. a lambda with pickle, a
    ``set`` with JSON) before anything is sent.

Signing (``signed``, ``signing_key``/``signing_keys``)
    Every item the serializer encodes (text and structured values) carries an
    HMAC-SHA256 over the key, the flags and the data, so an item written by
    anyone without the key, or copied from another key, is refused: write
    access to memcached does not become code execution through pickle.  Raw
    ``bytes`` (flags 0) and ``int`` (``FLAG_INTEGER``) items stay unsigned,
    because memcached itself rewrites them (``append``/``prepend`` for sets and
    lists, ``incr``/``decr`` for counters and namespace versions) and would
    break any signature.  They are inert, never given to a deserializer: set
    and list items are parsed by the strict codec of :mod:`.codec`.  The first
    key signs, every key verifies (rotation).

Compression (``compressor``, ``compress_min_len``; :mod:`.compression`)
    A value whose encoding is at least ``compress_min_len`` bytes is compressed
    when that makes it smaller, and its flags gain the compressor's bit; it is
    signed after compression, so a reader verifies before it inflates.  Raw
    ``bytes`` and ``int`` items are never compressed, for the reason they are
    never signed.  Every store reads zlib (bit 3: pylibmc's and pymemcache's
    ``CompressedSerde``'s compressed values) whatever it writes.

Values stored in chunks (``large_values="chunk"``; :mod:`.chunks`)
    The item under the key is then a manifest (flag bit 21) naming the chunk
    items.  The serde hands it as a :class:`~.chunks.ChunkManifest` to the
    chunked store's reads (:func:`~.chunks.reading_manifests`) and refuses it
    (``"format"``) everywhere else, so no other reader sees a manifest.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import pickle
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal

from pymemcache.serde import FLAG_BYTES, FLAG_INTEGER, FLAG_LONG, FLAG_PICKLE, FLAG_TEXT

from .chunks import FLAG_CHUNKED, ChunkManifest, reading_manifests
from .compression import (
    FLAG_ZLIB,
    FLAG_ZSTD,
    Compressor,
    DecompressionError,
    Decompressors,
    load_compressor,
)
from .envelope import FLAG_ENVELOPE, Envelope
from .exceptions import ConfigurationError, EncodingError
from .plugins import import_subclass

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

logger = logging.getLogger("django_mcpatterns.serializers")

FLAG_JSON = 1 << 17
FLAG_MSGPACK = 1 << 18
FLAG_SIGNED = 1 << 20
# Items memcached rewrites itself (append/prepend, incr/decr): never signed.
UNSIGNED_FLAGS = frozenset({FLAG_BYTES, FLAG_INTEGER})

DEFAULT_SERIALIZER = "django_mcpatterns.core.serializers.PickleSerializer"
# Shorter values gain little from compression (pymemcache measured 400 bytes as its
# break-even) and cost a compress on every write.
DEFAULT_COMPRESS_MIN_LEN = 1024
MAC_SIZE = hashlib.sha256().digest_size
MIN_SIGNING_KEY_BYTES = 32
# Domain separation: a MAC made here means nothing to any other HMAC user of the key.
_MAC_DOMAIN = b"django-mcpatterns signed value v1\x00"
_MAC_HEADER = struct.Struct(">IH")  # flags, key length

Reason = Literal["unsigned", "signature", "format", "corrupt"]


class _Refusal(EncodingError):
    """An item a reader will not decode, with why (the :class:`ValueRefused` reason)."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason


class UnpicklableValueError(EncodingError, pickle.PicklingError):
    """A value pickle cannot encode.

    Also a :class:`pickle.PicklingError`: Django's memcached backends and
    cachelib promise "a subclass of pickle.PickleError" for such values.
    """


# -- serializers -------------------------------------------------------------------


class Serializer:
    """Turn values into ``(bytes, flags)`` and back; name a subclass in ``OPTIONS["serializer"]``.

    ``bytes``, ``str`` and ``int`` have one encoding for every serializer (see
    the module docstring); everything else goes through :meth:`dumps` under
    :attr:`flag`.  Subclasses set :attr:`flag` (a bit no other serializer
    uses) and implement :meth:`dumps`/:meth:`loads`; any exception they raise
    becomes an :class:`~.exceptions.EncodingError`.  Instantiated once per
    store, without arguments.
    """

    flag: ClassVar[int]
    #: Whether loading data can run code (pickle can): ``mcpatterns.W005`` warns about it.
    loads_can_run_code: ClassVar[bool] = False
    #: What :meth:`serialize` raises for a value :meth:`dumps` cannot encode.
    encode_error: ClassVar[type[EncodingError]] = EncodingError

    @property
    def name(self) -> str:
        return type(self).__name__

    def dumps(self, value: Any) -> bytes:
        raise NotImplementedError

    def loads(self, data: bytes) -> Any:
        raise NotImplementedError

    def serialize(self, key: Any, value: Any) -> tuple[bytes, int]:
        kind = type(value)  # exact types: subclasses keep their type through the format
        if kind is bytes:
            return value, FLAG_BYTES
        if kind is int:
            return b"%d" % value, FLAG_INTEGER
        if kind is str:
            try:
                return value.encode("utf-8"), FLAG_TEXT
            except UnicodeEncodeError:
                pass  # lone surrogates are not UTF-8 text; the format keeps them
        try:
            return self.dumps(value), self.flag
        except Exception as exc:
            raise self.encode_error(
                f"{self.name} cannot encode the value of {key!r}, a {kind.__name__}: {exc}"
            ) from exc

    def deserialize(self, key: Any, data: bytes, flags: int) -> Any:
        """Decode an item; raise :class:`~.exceptions.EncodingError` when it is not ours."""
        if flags == FLAG_BYTES:
            return data
        if flags not in (FLAG_TEXT, FLAG_INTEGER, FLAG_LONG, self.flag):
            raise _Refusal("format", f"flags {flags:#x} are not a format of {self.name}")
        try:
            if flags == FLAG_TEXT:
                return data.decode("utf-8")
            if flags == self.flag:
                return self.loads(data)
            return int(data)  # FLAG_INTEGER; FLAG_LONG from python-memcache
        except Exception as exc:
            raise _Refusal(
                "corrupt", f"{len(data)} bytes under flags {flags:#x} do not decode: {exc!r}"
            ) from exc

    def __repr__(self) -> str:
        return f"{self.name}()"


class PickleSerializer(Serializer):
    """pickle, in pymemcache's ``pickle_serde`` layout: what Django's ``PyMemcacheCache`` reads.

    Unpickling runs code chosen by whoever wrote the data: use it with servers
    only your application can write to, or with signing.
    """

    flag = FLAG_PICKLE
    loads_can_run_code = True
    encode_error = UnpicklableValueError
    protocol: ClassVar[int] = pickle.HIGHEST_PROTOCOL  # pymemcache's DEFAULT_PICKLE_VERSION

    def dumps(self, value: Any) -> bytes:
        return pickle.dumps(value, self.protocol)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)


class JSONSerializer(Serializer):
    """JSON: ``None``, bools, floats, lists, dicts with str keys (and str, int, bytes as above).

    Tuples come back as lists and dict keys as strings; other types (sets,
    datetimes, objects) raise :class:`~.exceptions.EncodingError`.  Override
    :meth:`dumps`/:meth:`loads` for more (e.g. Django's ``DjangoJSONEncoder``).
    """

    flag = FLAG_JSON

    def dumps(self, value: Any) -> bytes:
        # ensure_ascii: lone surrogates stay \\u escapes, so the output is always valid.
        return json.dumps(value, separators=(",", ":")).encode("ascii")

    def loads(self, data: bytes) -> Any:
        return json.loads(data.decode("utf-8"))


class MsgpackSerializer(Serializer):
    """msgpack (the ``msgpack`` extra): compact, and bytes stay bytes inside containers.

    Tuples come back as lists; other types raise
    :class:`~.exceptions.EncodingError`.
    """

    flag = FLAG_MSGPACK

    def __init__(self) -> None:
        try:
            import msgpack
        except ImportError as exc:
            raise ConfigurationError(
                f"serializer {type(self).__name__} needs the msgpack package: "
                "pip install 'django-mcpatterns[msgpack]'",
                option="serializer",
            ) from exc
        self._packb = functools.partial(msgpack.packb, use_bin_type=True)
        # strict_map_key=False: a dict with int keys must read back as it was written.
        self._unpackb = functools.partial(msgpack.unpackb, raw=False, strict_map_key=False)

    def dumps(self, value: Any) -> bytes:
        return self._packb(value)  # type: ignore[no-any-return]

    def loads(self, data: bytes) -> Any:
        return self._unpackb(data)


BUILTIN_SERIALIZERS = tuple(
    f"{__name__}.{cls.__name__}" for cls in (PickleSerializer, JSONSerializer, MsgpackSerializer)
)


# Bits with a meaning of their own: text, integers, longs, envelopes, signatures.
_RESERVED_FLAGS = frozenset(
    {
        FLAG_TEXT,
        FLAG_INTEGER,
        FLAG_LONG,
        FLAG_ENVELOPE,
        FLAG_SIGNED,
        FLAG_ZLIB,
        FLAG_ZSTD,
        FLAG_CHUNKED,
    }
)


def _own_bit(flag: object) -> bool:
    return (
        type(flag) is int
        and 0 < flag < 2**32
        and flag & (flag - 1) == 0  # a single bit: formats never combine
        and flag not in _RESERVED_FLAGS
    )


def load_serializer(path: str) -> Serializer:
    """Import the :class:`Serializer` subclass at dotted ``path`` and instantiate it."""
    choices = ", ".join(repr(p) for p in BUILTIN_SERIALIZERS)
    if not isinstance(path, str) or "." not in path:
        raise ConfigurationError(
            f"option 'serializer' must be a dotted path to a Serializer class, not {path!r}; "
            f"built in: {choices}",
            option="serializer",
            choices=BUILTIN_SERIALIZERS,
        )
    built_in = f"built in: {choices}"
    found = import_subclass(path, Serializer, "serializer", built_in, BUILTIN_SERIALIZERS)
    flag = getattr(found, "flag", None)
    if not _own_bit(flag):
        raise ConfigurationError(
            f"option 'serializer': {path!r} must set 'flag' to a bit of its own "
            f"(one of bits 0-31, not {sorted(f.bit_length() - 1 for f in _RESERVED_FLAGS)}), "
            f"not {flag!r}",
            option="serializer",
        )
    return found()


# -- signing -----------------------------------------------------------------------


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
        raise _Refusal("signature", "its signature was not made by any configured signing key")

    @staticmethod
    def _mac(secret: bytes, key: Any, flags: int, payload: bytes) -> bytes:
        # The key is bound in: a signed value copied to another key is refused.
        kb = key.encode("utf-8") if isinstance(key, str) else bytes(key)
        mac = hmac.new(secret, _MAC_DOMAIN + _MAC_HEADER.pack(flags, len(kb)) + kb, hashlib.sha256)
        mac.update(payload)
        return mac.digest()

    def __repr__(self) -> str:
        return f"Signer({len(self._keys)} key{'s' if len(self._keys) > 1 else ''})"


# -- the store's serde -------------------------------------------------------------


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


class ValueSerde:
    """The serde of a store: a :class:`Serializer`, optional signing, and the read guard.

    ``deserialize`` never raises for stored data: an item it will not decode
    is logged, counted, reported to ``on_refused`` and returned as
    :data:`REFUSED`, which both stores turn into a miss.  ``serialize`` raises
    :class:`~.exceptions.EncodingError` for a value the serializer cannot
    encode.  ``compressor`` compresses values of at least
    ``compress_min_len`` bytes (see the module docstring).  Thread-safe.
    """

    __slots__ = (
        "_counts",
        "_decompressors",
        "_lock",
        "compress_min_len",
        "compressor",
        "on_refused",
        "serializer",
        "signer",
    )

    def __init__(
        self,
        serializer: Serializer | None = None,
        *,
        signing_keys: Sequence[bytes] = (),
        on_refused: Callable[[ValueRefused], object] | None = None,
        compressor: Compressor | None = None,
        compress_min_len: int = 0,
    ) -> None:
        self.serializer = serializer if serializer is not None else PickleSerializer()
        self.signer = Signer(signing_keys) if signing_keys else None
        self.on_refused = on_refused
        self.compressor = compressor
        self.compress_min_len = compress_min_len
        self._decompressors = Decompressors(compressor)
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def serialize(self, key: Any, value: Any) -> tuple[bytes, int]:
        data, flags = self.serializer.serialize(key, value)
        if flags in UNSIGNED_FLAGS:
            return data, flags  # memcached rewrites these itself: neither compressed nor signed
        compressor = self.compressor
        if compressor is not None and len(data) >= self.compress_min_len:
            packed = compressor.compress(data)
            if len(packed) < len(data):  # as pylibmc: kept only when it saves space
                data, flags = packed, flags | compressor.flag
        if self.signer is None:
            return data, flags
        flags |= FLAG_SIGNED
        return self.signer.sign(key, flags, data), flags

    def deserialize(self, key: Any, data: bytes, flags: int) -> Any:
        try:
            if flags == FLAG_CHUNKED:
                if not reading_manifests():
                    raise _Refusal(
                        "format",
                        "it is a value stored in chunks, which only the cache API of a cache "
                        "with OPTIONS['large_values'] = 'chunk' reads",
                    )
                return ChunkManifest.parse(data)
            if flags & FLAG_SIGNED:
                if self.signer is None:
                    raise _Refusal("format", "it is signed, and this cache does not sign")
                data = self.signer.verify(key, flags, data)
                flags &= ~FLAG_SIGNED
            elif self.signer is not None and flags not in UNSIGNED_FLAGS:
                raise _Refusal("unsigned", f"flags {flags:#x} without a signature")
            if flags & self._decompressors.mask:
                try:
                    data, flags = self._decompressors.decompress(data, flags)
                except DecompressionError as exc:
                    missing = "not installed" in str(exc)
                    raise _Refusal("format" if missing else "corrupt", str(exc)) from exc
            return self.serializer.deserialize(key, data, flags)
        except EncodingError as exc:
            # A custom serializer's own EncodingError is corrupt data too.
            self._refuse(key, flags, getattr(exc, "reason", "corrupt"), str(exc))
            return REFUSED

    def refusals(self) -> dict[str, int]:
        """How many items were refused so far, by reason."""
        with self._lock:
            return dict(self._counts)

    def _refuse(self, key: Any, flags: int, reason: Reason, detail: str) -> None:
        kb = key.encode("utf-8") if isinstance(key, str) else bytes(key)
        with self._lock:
            self._counts[reason] += 1
        logger.warning(
            "refused the cached value of %r (%s): %s; read as a miss", kb, reason, detail
        )
        if self.on_refused is not None:
            try:
                self.on_refused(ValueRefused(kb, reason, flags, detail))
            except Exception:
                logger.exception("on_refused handler failed for %r", kb)

    def __repr__(self) -> str:
        signed = f", {self.signer!r}" if self.signer else ""
        compressed = f", {self.compressor!r}>={self.compress_min_len}" if self.compressor else ""
        return f"ValueSerde({self.serializer!r}{signed}{compressed})"


# -- options -----------------------------------------------------------------------


@dataclass(frozen=True)
class SerdeOptions:
    """The serialisation options of ``OPTIONS``, validated; :meth:`build` makes the serde.

    serializer
        Dotted path of a :class:`Serializer` subclass (pickle by default).
    signed
        Sign values (see the module docstring).  Unset (``None``), giving a
        key turns it on; ``False`` with a key is an error; ``True`` without a
        key is an error here (Django and Flask derive one from ``SECRET_KEY``
        first).  Normalised to whether values are signed.
    signing_key, signing_keys
        One key, or several for rotation (the first signs, all verify); str
        (UTF-8) or bytes of at least 32 bytes.  Normalised into
        ``signing_keys`` (a tuple of bytes); never shown in ``repr``.
    compressor, compress_min_len
        Compress values of at least ``compress_min_len`` bytes with
        ``compressor`` (``"zlib"``, ``"zstd"`` or a dotted path; see
        :mod:`.compression`).  Off unless one of them is given: the
        compressor alone compresses from :data:`DEFAULT_COMPRESS_MIN_LEN`
        bytes, the length alone with zlib.  Normalised: ``compressor`` is
        None or a name, ``compress_min_len`` None (off) or an int.
    """

    serializer: str = DEFAULT_SERIALIZER
    signed: bool | None = None
    signing_key: str | bytes | None = field(default=None, repr=False)
    signing_keys: Sequence[str | bytes] = field(default=(), repr=False)
    compressor: str | None = None
    compress_min_len: int | None = None

    NAMES: ClassVar[tuple[str, ...]] = (
        "serializer",
        "signed",
        "signing_key",
        "signing_keys",
        "compressor",
        "compress_min_len",
    )

    def __post_init__(self) -> None:
        load_serializer(self.serializer)  # importable and constructible, or a clear error
        self._check_values()
        if self.signed is not None and not isinstance(self.signed, bool):
            raise ConfigurationError(
                f"option 'signed' must be True or False, not {self.signed!r}", option="signed"
            )
        keys = _signing_keys(self.signing_key, self.signing_keys)
        if self.signed is False and keys:
            raise ConfigurationError(
                "option 'signed' is False but a signing key is given; drop one of them",
                option="signed",
            )
        if self.signed and not keys:
            raise ConfigurationError(
                "option 'signed' needs 'signing_key' or 'signing_keys' (Django and Flask "
                "derive one from SECRET_KEY)",
                option="signing_key",
            )
        # Normalised: signed says whether values are signed, signing_keys holds every key.
        object.__setattr__(self, "signed", bool(keys))
        object.__setattr__(self, "signing_key", None)
        object.__setattr__(self, "signing_keys", keys)

    def _check_values(self) -> None:
        """Validate and normalise the compression options."""
        length = self.compress_min_len
        if length is not None and (
            not isinstance(length, int) or isinstance(length, bool) or length < 0
        ):
            raise ConfigurationError(
                f"option 'compress_min_len' must be a number of bytes >= 0 or None, not {length!r}",
                option="compress_min_len",
            )
        if self.compressor is None and length is None:
            return  # compression off (the default)
        name = "zlib" if self.compressor is None else self.compressor
        load_compressor(name)  # importable, installed and with a bit of its own, or a clear error
        object.__setattr__(self, "compressor", name)
        if length is None:
            object.__setattr__(self, "compress_min_len", DEFAULT_COMPRESS_MIN_LEN)

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> SerdeOptions:
        """The serialisation options among ``options`` (other keys are ignored)."""
        return cls(**{name: options[name] for name in cls.NAMES if name in options})

    def build(self, on_refused: Callable[[ValueRefused], object] | None = None) -> ValueSerde:
        return ValueSerde(
            load_serializer(self.serializer),
            signing_keys=self.signing_keys,  # type: ignore[arg-type]
            on_refused=on_refused,
            compressor=None if self.compressor is None else load_compressor(self.compressor),
            compress_min_len=self.compress_min_len or 0,
        )

    @property
    def executes_code_on_read(self) -> bool:
        """Whether a reader can be made to run code by whoever writes to memcached."""
        return not self.signed and load_serializer(self.serializer).loads_can_run_code


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


def _signing_keys(one: object, many: object) -> tuple[bytes, ...]:
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
