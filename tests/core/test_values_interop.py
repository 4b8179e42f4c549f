"""Values shared with the peers on real memcached: pylibmc and pymemcache write, we read, and back.

pylibmc (built on Debian's libmemcached) compresses with zlib under its flag
bit 3, pymemcache's ``CompressedSerde`` under the same bit: a cluster reads
both with no configuration, and its zlib values read in both.  Zero-byte
values are items of length 0, hits for every client.  Both protocols.
"""

from __future__ import annotations

import datetime
import pickle
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from pymemcache.client.base import Client as PymemcacheClient
from pymemcache.serde import CompressedSerde, pickle_serde

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.options import ClusterOptions
from tests.conftest import flush
from tests.harness import MemcachedServer, raw_client, require_module

ROWS = {"rows": [{"id": i, "name": f"user {i}", "mail": f"u{i}@x.org"} for i in range(3000)]}
TEXT = "lorem ipsum dolor sit amet " * 4000  # 108 KB of text


@pytest.fixture(scope="module")
def pylibmc() -> ModuleType:
    return require_module(
        "pylibmc", "pip install --no-binary pylibmc pylibmc, against apt's libmemcached-dev"
    )


@pytest.fixture
def server(memcached_1: list[MemcachedServer]) -> MemcachedServer:
    flush(memcached_1)
    return memcached_1[0]


@pytest.fixture
def peer(pylibmc: ModuleType, server: MemcachedServer) -> Any:
    return pylibmc.Client([server.spec])  # text protocol, pylibmc's own serialisation


@pytest.fixture
def compressed_serde_client(server: MemcachedServer) -> PymemcacheClient:
    return raw_client(server, serde=CompressedSerde(min_compress_len=100))


@pytest.fixture(params=["meta", "text"])
def cluster(request: pytest.FixtureRequest, server: MemcachedServer) -> Iterator[Cluster]:
    """Our cluster as a user configures it for reading: nothing about compression."""
    cluster = Cluster([server.spec], ClusterOptions(protocol=request.param))
    yield cluster
    cluster.close()


def item_size_and_flags(server: MemcachedServer, key: str) -> tuple[int, int]:
    """What memcached holds for ``key``: the value's length and its client flags (mg s f)."""
    line = raw_client(server).raw_command(b"mg " + key.encode() + b" s f", end_tokens=b"\r\n")
    fields = {token[:1]: token[1:] for token in line.split()[1:]}
    return int(fields[b"s"]), int(fields[b"f"])


# -- they write, we read -----------------------------------------------------------


@pytest.mark.parametrize("value", [ROWS, TEXT, TEXT.encode()], ids=["pickled", "text", "bytes"])
def test_we_read_what_pylibmc_compressed(
    peer: Any, cluster: Cluster, server: MemcachedServer, value: Any
) -> None:
    peer.set("from:pylibmc", value, min_compress_len=100)
    assert item_size_and_flags(server, "from:pylibmc")[1] & 8  # pylibmc's zlib flag
    got = cluster.get("from:pylibmc")
    assert type(got) is type(value)
    assert got == value


def test_we_read_what_pymemcache_compressed_serde_wrote(
    compressed_serde_client: PymemcacheClient, cluster: Cluster, server: MemcachedServer
) -> None:
    compressed_serde_client.set("from:pymemcache", ROWS)
    compressed_serde_client.set("from:pymemcache:text", TEXT)
    assert item_size_and_flags(server, "from:pymemcache")[1] == 1 | 8  # pickle + compressed
    assert cluster.get_many(["from:pymemcache", "from:pymemcache:text"]) == {
        "from:pymemcache": ROWS,
        "from:pymemcache:text": TEXT,
    }


def test_we_read_pylibmcs_uncompressed_types_too(peer: Any, cluster: Cluster) -> None:
    values = {"int": 12345, "big": 2**70, "text": "ünï", "bytes": b"\x00\xff", "obj": [1, (2,)]}
    for key, value in values.items():
        peer.set(key, value)
    assert cluster.get_many(list(values)) == values


def test_pylibmcs_none_dicts_and_dates_read_and_bools_come_back_as_ints(
    peer: Any, cluster: Cluster
) -> None:
    """What docs/migration.md says of pylibmc's values, bools' one exception included."""
    values = {"none": None, "dict": {"a": [1, 2]}, "date": datetime.date(2024, 1, 2)}
    for key, value in values.items():
        peer.set(key, value)
    peer.set("yes", True)
    peer.set("no", False)
    assert cluster.get_many([*values, "yes", "no"]) == {**values, "yes": 1, "no": 0}
    assert type(cluster.get("yes")) is int


# -- we write, they read -----------------------------------------------------------


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_pylibmc_and_pymemcache_read_our_zlib_values(
    peer: Any,
    compressed_serde_client: PymemcacheClient,
    server: MemcachedServer,
    protocol: str,
) -> None:
    ours = Cluster(
        [server.spec],
        ClusterOptions(protocol=protocol, compressor="zlib", compress_min_len=1024),  # type: ignore[arg-type]
    )
    ours.set("ours:rows", ROWS)
    ours.set("ours:text", TEXT)
    assert item_size_and_flags(server, "ours:rows")[1] == 1 | 8
    assert peer.get("ours:rows") == ROWS
    assert peer.get("ours:text") == TEXT
    assert compressed_serde_client.get("ours:rows") == ROWS
    assert compressed_serde_client.get("ours:text") == TEXT


@pytest.mark.parametrize(("compressor", "bit"), [("zlib", 8), ("zstd", 1 << 19)])
def test_a_100_kb_value_takes_well_under_30_percent_in_memcached(
    server: MemcachedServer, compressor: str, bit: int
) -> None:
    ours = Cluster([server.spec], ClusterOptions(compressor=compressor, compress_min_len=1024))
    plain = len(pickle.dumps(ROWS, pickle.HIGHEST_PROTOCOL))
    assert plain > 100_000
    ours.set("sized", ROWS)
    size, flags = item_size_and_flags(server, "sized")
    assert flags == 1 | bit
    assert size < 0.3 * plain  # measured: zlib 13.6 %, zstd 8.4 % of 93,575 bytes
    assert Cluster([server.spec]).get("sized") == ROWS  # a reader without the option


# -- zero-byte values ----------------------------------------------------------------


@pytest.mark.parametrize("value", [b"", ""], ids=["bytes", "str"])
def test_zero_byte_values_are_zero_length_items_and_hits(
    peer: Any, cluster: Cluster, server: MemcachedServer, value: Any
) -> None:
    assert cluster.set("empty", value)
    assert item_size_and_flags(server, "empty") == (0, 0 if value == b"" else 16)
    assert cluster.get("empty", "miss") == value
    assert cluster.gets("empty")[0] == value
    assert cluster.gets_ttl("empty")[0] == value
    assert cluster.get_many(["empty"]) == {"empty": value}
    assert peer.get("empty") == value  # a zero-length item is a hit for the peers too
    assert raw_client(server, serde=pickle_serde).get("empty") == value


def test_zero_byte_values_from_pylibmc_are_hits(peer: Any, cluster: Cluster) -> None:
    peer.set("empty:bytes", b"")
    peer.set("empty:text", "")
    assert cluster.get_many(["empty:bytes", "empty:text", "absent"]) == {
        "empty:bytes": b"",
        "empty:text": "",
    }
