"""Value compression: zlib in pylibmc's flags, zstd through an extra, or a compressor of yours.

A compressed item keeps the flags of what it holds and adds its compressor's bit,
so a reader knows from the flags alone (never by trying) how to read it::

    compressor       flag bit          written by
    zlib             FLAG_ZLIB (1 << 3) pylibmc (PYLIBMC_FLAG_ZLIB), pymemcache's
                                        CompressedSerde (FLAG_COMPRESSED), us
    zstd             FLAG_ZSTD (1 << 19) us (the ``zstd`` extra: ``zstandard``)

Bit 3 is the bit pylibmc and pymemcache both set for zlib, so their compressed
values read here without configuration, and our zlib values read there
(pickle, text, integers and bytes are laid out alike: see :mod:`.serializers`).
Bit 19 is clear of theirs, of the envelope (16) and of our serializers (17, 18)
and signatures (20).

Every store reads zlib; zstd when ``zstandard`` is installed; a custom
compressor's bit when that compressor is configured.  An item whose
compressor is unknown here, or whose data does not decompress (or would
decompress past :data:`MAX_DECOMPRESSED`, a bomb), is refused like any other
unreadable item (:mod:`.serializers`): a miss, logged and counted.
"""

from __future__ import annotations

import threading
import zlib
from typing import Any, ClassVar

from ..exceptions import ConfigurationError
from .plugins import import_subclass

__all__ = [
    "FLAG_ZLIB",
    "FLAG_ZSTD",
    "MAX_DECOMPRESSED",
    "Compressor",
    "DecompressionError",
    "ZlibCompressor",
    "ZstdCompressor",
    "load_compressor",
]

FLAG_ZLIB = 1 << 3
FLAG_ZSTD = 1 << 19
# No value decompresses past this: 1 MB of zlib can inflate to 1 GB.
MAX_DECOMPRESSED = 256 * 1024 * 1024


class DecompressionError(Exception):
    """Data that does not decompress under its flags (corrupt, or a bomb)."""


class Compressor:
    """Compress serialised values; name a subclass in ``OPTIONS["compressor"]``.

    Subclasses set :attr:`flag` (a bit no serializer or other compressor
    uses) and implement :meth:`compress` and :meth:`decompress`;
    ``decompress`` must stop at ``max_length`` bytes of output and raise
    :class:`DecompressionError` past it.  Instantiated once per store,
    without arguments.
    """

    flag: ClassVar[int]

    @property
    def name(self) -> str:
        return type(self).__name__

    def compress(self, data: bytes) -> bytes:
        raise NotImplementedError

    def decompress(self, data: bytes, max_length: int = MAX_DECOMPRESSED) -> bytes:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{self.name}()"


class ZlibCompressor(Compressor):
    """zlib (RFC 1950 streams, level 6), what pylibmc and pymemcache write under bit 3."""

    flag = FLAG_ZLIB
    level: ClassVar[int] = 6  # zlib's Z_DEFAULT_COMPRESSION, pylibmc's default

    def compress(self, data: bytes) -> bytes:
        return zlib.compress(data, self.level)

    def decompress(self, data: bytes, max_length: int = MAX_DECOMPRESSED) -> bytes:
        inflater = zlib.decompressobj()
        try:
            out = inflater.decompress(data, max_length)
        except zlib.error as exc:
            raise DecompressionError(f"not a zlib stream: {exc}") from exc
        if inflater.unconsumed_tail:
            raise DecompressionError(f"inflates past {max_length} bytes")
        if not inflater.eof:
            raise DecompressionError("the zlib stream is truncated")
        return out


class ZstdCompressor(Compressor):
    """Zstandard (the ``zstd`` extra): about zlib's ratio at a fraction of its CPU."""

    flag = FLAG_ZSTD
    level: ClassVar[int] = 3  # zstd's default

    def __init__(self) -> None:
        zstandard = _zstandard()
        if zstandard is None:
            raise ConfigurationError(
                "compressor 'zstd' needs the zstandard package: "
                "pip install 'django-mcpatterns[zstd]'",
                option="compressor",
            )
        self._zstandard = zstandard
        # zstandard's (de)compressor objects must not be shared by threads: one each.
        self._local = threading.local()

    def _contexts(self) -> Any:
        local = self._local
        if not hasattr(local, "compressor"):
            local.compressor = self._zstandard.ZstdCompressor(level=self.level)
            local.decompressor = self._zstandard.ZstdDecompressor()
        return local

    def compress(self, data: bytes) -> bytes:
        # The content size in the frame header lets a reader refuse a bomb before inflating.
        return self._contexts().compressor.compress(data)  # type: ignore[no-any-return]

    def decompress(self, data: bytes, max_length: int = MAX_DECOMPRESSED) -> bytes:
        try:
            size = self._zstandard.frame_content_size(data)
            if size > max_length:
                raise DecompressionError(f"inflates to {size} bytes, past {max_length}")
            # Without a size in the frame, max_output_size bounds the output.
            out = self._contexts().decompressor.decompress(data, max_output_size=max_length)
        except self._zstandard.ZstdError as exc:
            raise DecompressionError(f"not a zstd frame: {exc}") from exc
        return out  # type: ignore[no-any-return]


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard


BUILTIN_COMPRESSORS = {"zlib": ZlibCompressor, "zstd": ZstdCompressor}
# Bits a custom compressor may not take: formats, envelopes, signatures, the built-ins.
_TAKEN_BITS = frozenset({1 << b for b in (0, 1, 2, 4, 16, 17, 18, 20, 21)}) | {
    FLAG_ZLIB,
    FLAG_ZSTD,
}


def load_compressor(spec: str) -> Compressor:
    """The compressor ``spec`` names: ``"zlib"``, ``"zstd"`` or the dotted path of a subclass."""
    choices = "'zlib', 'zstd' or the dotted path of a Compressor subclass"
    if spec in BUILTIN_COMPRESSORS:
        return BUILTIN_COMPRESSORS[spec]()
    if not isinstance(spec, str) or "." not in spec:
        raise ConfigurationError(
            f"option 'compressor' must be {choices}, not {spec!r}",
            option="compressor",
            choices=tuple(BUILTIN_COMPRESSORS),
        )
    found = import_subclass(spec, Compressor, "compressor", f"valid: {choices}")
    flag = getattr(found, "flag", None)
    own_bit = type(flag) is int and 0 < flag < 2**32 and not flag & (flag - 1)
    if found not in BUILTIN_COMPRESSORS.values() and (not own_bit or flag in _TAKEN_BITS):
        raise ConfigurationError(
            f"option 'compressor': {spec!r} must set 'flag' to a bit of its own "
            f"(not bits 0-4 or 16-21, nor zlib's 3 and zstd's 19), not {flag!r}",
            option="compressor",
        )
    return found()


class Decompressors:
    """Every compressor a store reads, by flag bit: zlib, zstd if installed, the configured one."""

    __slots__ = ("_by_flag", "mask", "max_length")

    def __init__(self, configured: Compressor | None = None) -> None:
        self.max_length = MAX_DECOMPRESSED
        self._by_flag: dict[int, Compressor | None] = {FLAG_ZLIB: ZlibCompressor()}
        self._by_flag[FLAG_ZSTD] = ZstdCompressor() if _zstandard() is not None else None
        if configured is not None:
            self._by_flag[configured.flag] = configured
        self.mask = 0
        for flag in self._by_flag:
            self.mask |= flag

    def decompress(self, data: bytes, flags: int) -> tuple[bytes, int]:
        """Return ``(data, flags)`` with every compression bit undone, or raise.

        :class:`DecompressionError` for corrupt data, an unknown or missing compressor,
        or two compression bits at once.
        """
        bits = flags & self.mask
        if bits & (bits - 1):
            raise DecompressionError(f"flags {flags:#x} name two compressors")
        compressor = self._by_flag[bits]
        if compressor is None:
            raise DecompressionError(
                "compressed with zstd, and the zstandard package is not installed "
                "(pip install 'django-mcpatterns[zstd]')"
            )
        return compressor.decompress(data, self.max_length), flags & ~bits
