"""The serde of a store: its serializer, signing, compression and the read guard.

A store turns every value into ``(bytes, flags)`` through a *serde* (pymemcache's
protocol).  The serde of our stores is a :class:`ValueSerde`: the serializer named
by ``OPTIONS["serializer"]`` (:mod:`.serializers`), optional signing
(:mod:`.signing`), optional compression, and the read guard that decides what
happens to an item it will not decode (:mod:`.refusals`).  :class:`SerdeOptions`
validates those options and builds it.  The soft-expiry envelope
(:mod:`.envelope`, flag bit 16) wraps it.

Compression (``compressor``, ``compress_min_len``; :mod:`.compression`)
    A value whose encoding is at least ``compress_min_len`` bytes is compressed
    when that makes it smaller, and its flags gain the compressor's bit; it is
    signed after compression, so a reader verifies before it inflates.  Raw
    ``bytes`` and ``int`` items are never compressed, for the reason they are
    never signed.  Every store reads zlib (bit 3: pylibmc's and pymemcache's
    ``CompressedSerde``'s compressed values) whatever it writes.

Values stored in chunks (``large_values="chunk"``; :mod:`.layout`)
    The item under the key is then a manifest (flag bit 21) naming the chunk
    items.  The serde hands it as a :class:`~.layout.ChunkManifest` to the
    chunked store's reads (:func:`~.layout.reading_manifests`) and refuses it
    (``"format"``) everywhere else, so no other reader sees a manifest.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pymemcache.serde import FLAG_BYTES, FLAG_INTEGER, FLAG_LONG, FLAG_TEXT

from ..exceptions import ConfigurationError, EncodingError
from .compression import Compressor, DecompressionError, Decompressors, load_compressor
from .layout import FLAG_CHUNKED, ChunkManifest, reading_manifests
from .refusals import REFUSED, Reason, Refusal, ValueRefused
from .serializers import DEFAULT_SERIALIZER, PickleSerializer, Serializer, load_serializer
from .signing import FLAG_SIGNED, UNSIGNED_FLAGS, Signer, parse_signing_keys

__all__ = ["DEFAULT_COMPRESS_MIN_LEN", "SerdeOptions", "ValueSerde"]

logger = logging.getLogger("django_mcpatterns.serializers")

# Shorter values gain little from compression (pymemcache measured 400 bytes as its
# break-even) and cost a compress on every write.
DEFAULT_COMPRESS_MIN_LEN = 1024


class ValueSerde:
    """The serde of a store: a :class:`Serializer`, optional signing, and the read guard.

    ``deserialize`` never raises for stored data: an item it will not decode
    is logged, counted, reported to ``on_refused`` and returned as
    :data:`REFUSED`, which both stores turn into a miss.  ``serialize`` raises
    :class:`~django_mcpatterns.core.exceptions.EncodingError` for a value the serializer cannot
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
                    raise Refusal(
                        "format",
                        "it is a value stored in chunks, which only the cache API of a cache "
                        "with OPTIONS['large_values'] = 'chunk' reads",
                    )
                return ChunkManifest.parse(data)
            if flags & FLAG_SIGNED:
                if self.signer is None:
                    raise Refusal("format", "it is signed, and this cache does not sign")
                data = self.signer.verify(key, flags, data)
                flags &= ~FLAG_SIGNED
            elif self.signer is not None and flags not in UNSIGNED_FLAGS:
                raise Refusal("unsigned", f"flags {flags:#x} without a signature")
            if flags & self._decompressors.mask:
                try:
                    data, flags = self._decompressors.decompress(data, flags)
                except DecompressionError as exc:
                    missing = "not installed" in str(exc)
                    raise Refusal("format" if missing else "corrupt", str(exc)) from exc
            return self.serializer.deserialize(key, data, flags)
        except EncodingError as exc:
            # A custom serializer's own EncodingError is corrupt data too.
            self._refuse(key, flags, getattr(exc, "reason", "corrupt"), str(exc))
            return REFUSED

    def direct_formats(self) -> dict[int, Callable[[bytes], Any]]:
        """The flags whose data :meth:`deserialize` hands straight to the format, by flags.

        Decided once per store (the hot path then skips the layers): bytes and
        ints always (never signed nor compressed), text unless values are
        signed; only for a serializer that keeps the base class's formats.  A
        decoder that raises (``ValueError``: not what its flags say) leaves the
        item to :meth:`deserialize`, which refuses it.
        """
        if type(self.serializer).deserialize is not Serializer.deserialize:
            return {}
        formats: dict[int, Callable[[bytes], Any]] = {FLAG_BYTES: bytes, FLAG_INTEGER: int}
        if self.signer is None:
            formats |= {FLAG_TEXT: bytes.decode, FLAG_LONG: int}
        return {flags: f for flags, f in formats.items() if not flags & self._decompressors.mask}

    def direct_types(self) -> frozenset[type]:
        """The types :meth:`serialize` writes bare (``bytes`` as they are, ``str`` as its
        UTF-8 unless signed or compressed): decided once per store, as :meth:`direct_formats`."""
        if type(self.serializer).serialize is not Serializer.serialize:
            return frozenset()
        if self.signer is None and self.compressor is None:
            return frozenset({bytes, str})
        return frozenset({bytes})

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
        keys = parse_signing_keys(self.signing_key, self.signing_keys)
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
