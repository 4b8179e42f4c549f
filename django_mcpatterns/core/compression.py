"""The compressors' documented path: they live in :mod:`django_mcpatterns.core.values`."""

from __future__ import annotations

from .values.compression import (
    FLAG_ZLIB,
    FLAG_ZSTD,
    MAX_DECOMPRESSED,
    Compressor,
    DecompressionError,
    ZlibCompressor,
    ZstdCompressor,
    load_compressor,
)

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
