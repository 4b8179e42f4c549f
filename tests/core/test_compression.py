"""Compression in the serde: what is compressed, what is read, and what is refused.

The serde is exercised through the embedded store (the same serde object the
Cluster uses); the real peers (pylibmc, pymemcache) are in test_values_interop.py.
"""

from __future__ import annotations

import pickle
import zlib
from typing import Any

import pytest

from django_mcpatterns.core.compression import (
    FLAG_ZLIB,
    FLAG_ZSTD,
    MAX_DECOMPRESSED,
    Compressor,
    ZlibCompressor,
    load_compressor,
)
from django_mcpatterns.core.exceptions import ConfigurationError
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.serializers import (
    DEFAULT_COMPRESS_MIN_LEN,
    FLAG_SIGNED,
    SerdeOptions,
    ValueRefused,
)
from django_mcpatterns.core.values import compression

ROWS = {"rows": [{"id": i, "name": f"user {i}", "mail": f"u{i}@example.com"} for i in range(1500)]}
KEY = "k" * 32
BOMB_LIMIT = 1 << 20  # stands for MAX_DECOMPRESSED (256 MiB) in the bomb test


def store_with(**options: Any) -> tuple[MemoryStore, list[ValueRefused]]:
    refused: list[ValueRefused] = []
    serde = SerdeOptions(**options).build(refused.append)
    return MemoryStore(serde=serde, max_item_size=4 * 1024 * 1024, max_bytes=64 << 20), refused


def stored(store: MemoryStore, key: str) -> tuple[bytes, int]:
    item = store._items[key.encode()]  # what memcached would hold: the item's bytes and flags
    return item.data, item.flags


class Pylibmc(Compressor):
    """A custom compressor on a bit of its own, as a user would write one."""

    flag = 1 << 25

    def compress(self, data: bytes) -> bytes:
        return zlib.compress(data, 1)

    def decompress(self, data: bytes, max_length: int = MAX_DECOMPRESSED) -> bytes:
        return ZlibCompressor().decompress(data, max_length)


class TakesZlibsBit(Pylibmc):
    flag = FLAG_ZLIB


# -- options ---------------------------------------------------------------------


def test_compression_is_off_by_default() -> None:
    store, _ = store_with()
    store.set("v", ROWS)
    data, flags = stored(store, "v")
    assert flags == 1  # pickle, uncompressed
    assert pickle.loads(data) == ROWS


@pytest.mark.parametrize(
    ("options", "compressor", "min_len"),
    [
        ({"compressor": "zlib"}, "zlib", DEFAULT_COMPRESS_MIN_LEN),
        ({"compress_min_len": 10}, "zlib", 10),
        ({"compressor": "zstd", "compress_min_len": 0}, "zstd", 0),
    ],
)
def test_either_option_turns_compression_on(
    options: dict[str, Any], compressor: str, min_len: int
) -> None:
    parsed = ClusterOptions.from_mapping(options)
    assert (parsed.compressor, parsed.compress_min_len) == (compressor, min_len)


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"compressor": "lz4"}, "'zlib', 'zstd'"),
        ({"compressor": 3}, "'zlib', 'zstd'"),
        ({"compressor": "no.such.Compressor"}, "cannot import"),
        ({"compressor": "tests.core.test_compression.TakesZlibsBit"}, "a bit of its own"),
        ({"compressor": "tests.core.test_compression.ROWS"}, "not a subclass"),
        ({"compress_min_len": -1}, "'compress_min_len'"),
        ({"compress_min_len": "1k"}, "'compress_min_len'"),
        ({"large_values": "split"}, "'refuse', 'chunk'"),
        ({"long_keys": "truncate"}, "'refuse', 'hash'"),
        ({"max_item_size": 100}, "'max_item_size'"),
    ],
)
def test_bad_values_are_clear_errors(options: dict[str, Any], names: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        ClusterOptions.from_mapping(options)
    assert names in str(caught.value)
    assert caught.value.option == next(iter(options))


def test_zstd_without_its_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compression, "_zstandard", lambda: None)  # as if not installed
    with pytest.raises(ConfigurationError, match=r"django-mcpatterns\[zstd\]"):
        ClusterOptions.from_mapping({"compressor": "zstd"})


# -- writing -----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "flag"), [("zlib", FLAG_ZLIB), ("zstd", FLAG_ZSTD)])
def test_a_100_kb_compressible_value_takes_well_under_30_percent(name: str, flag: int) -> None:
    store, _ = store_with(compressor=name, compress_min_len=1024)
    value = {"rows": [{"id": i, "name": f"user {i}", "mail": f"u{i}@x.org"} for i in range(3000)]}
    plain = len(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
    assert plain > 100_000
    store.set("v", value)
    data, flags = stored(store, "v")
    assert flags == 1 | flag  # pickle's flag, plus the compressor's bit
    assert len(data) < 0.3 * plain
    assert store.get("v") == value


def test_values_under_the_minimum_length_stay_plain() -> None:
    store, _ = store_with(compress_min_len=2000)
    store.set("short", "a" * 1999)
    store.set("long", "a" * 2000)
    assert stored(store, "short") == (b"a" * 1999, 16)
    assert stored(store, "long")[1] == 16 | FLAG_ZLIB
    assert store.get("long") == "a" * 2000


def test_a_value_compression_would_grow_is_kept_plain() -> None:
    import os

    store, _ = store_with(compress_min_len=0)
    noise = os.urandom(5000).hex()  # hex digits: zlib saves a little...
    random_bytes = (os.urandom(3000),)  # ...pickled noise it cannot shrink
    store.set("hex", noise)
    store.set("random", random_bytes)
    assert stored(store, "hex")[1] & FLAG_ZLIB
    assert stored(store, "random")[1] == 1  # pickle, as it was
    assert store.get("random") == random_bytes


def test_raw_bytes_and_ints_are_never_compressed_so_append_and_incr_still_work() -> None:
    store, _ = store_with(compress_min_len=0)
    store.set("set-item", b"+member" * 1000)
    store.set("counter", 10**18)
    assert stored(store, "set-item")[1] == 0
    assert store.append("set-item", b"+more")
    assert store.get("set-item") == b"+member" * 1000 + b"+more"
    assert stored(store, "counter") == (b"%d" % 10**18, 2)
    assert store.incr("counter", 1) == 10**18 + 1


def test_signed_values_are_compressed_first_and_verified_before_inflating() -> None:
    store, refused = store_with(compress_min_len=0, signing_key="s" * 32)
    store.set("v", ROWS)
    _data, flags = stored(store, "v")
    assert flags == 1 | FLAG_ZLIB | FLAG_SIGNED
    assert store.get("v") == ROWS
    # A forged compressed item (a bomb, say) is refused by its signature, never inflated.
    bomb = zlib.compress(b"\0" * (50 << 20))
    store._items[b"v"] = store._items[b"v"].__class__(bomb, flags, None, 1, 0)
    assert store.get("v", "miss") == "miss"
    assert [r.reason for r in refused] == ["signature"]


def test_a_custom_compressor_by_dotted_path() -> None:
    store, _ = store_with(compressor="tests.core.test_compression.Pylibmc", compress_min_len=0)
    store.set("v", "text " * 1000)
    assert stored(store, "v")[1] == 16 | Pylibmc.flag
    assert store.get("v") == "text " * 1000
    assert isinstance(load_compressor("tests.core.test_compression.Pylibmc"), Pylibmc)


# -- reading -----------------------------------------------------------------------


def test_every_store_reads_zlib_and_zstd_whatever_it_writes() -> None:
    writer_zlib, _ = store_with(compressor="zlib", compress_min_len=0)
    writer_zstd, _ = store_with(compressor="zstd", compress_min_len=0)
    reader, refused = store_with()  # compression off
    for writer in (writer_zlib, writer_zstd):
        writer.set("v", ROWS)
        reader._items[b"v"] = writer._items[b"v"]
        assert reader.get("v") == ROWS
    assert refused == []


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"not zlib at all", "corrupt"),
        (zlib.compress(pickle.dumps(ROWS))[:-10], "corrupt"),  # truncated
        (zlib.compress(b"\0" * (BOMB_LIMIT + 1)), "corrupt"),  # a bomb
    ],
    ids=["garbage", "truncated", "bomb"],
)
def test_bad_compressed_data_is_refused_as_a_miss(
    data: bytes, reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compression, "MAX_DECOMPRESSED", BOMB_LIMIT)
    store, refused = store_with()
    store.set("v", "x")
    item = store._items[b"v"]
    store._items[b"v"] = item.__class__(data, 1 | FLAG_ZLIB, None, item.cas, len(data))
    assert store.get("v", "miss") == "miss"
    assert [r.reason for r in refused] == [reason]
    assert b"v" in store._items  # left in place: it may be another client's value


def test_zstd_values_without_zstandard_are_refused_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer, _ = store_with(compressor="zstd", compress_min_len=0)
    writer.set("v", ROWS)
    monkeypatch.setattr(compression, "_zstandard", lambda: None)
    reader, refused = store_with()
    reader._items[b"v"] = writer._items[b"v"]
    assert reader.get("v", "miss") == "miss"
    assert refused[0].reason == "format"
    assert "django-mcpatterns[zstd]" in refused[0].detail
