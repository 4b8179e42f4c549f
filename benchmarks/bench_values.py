"""Compression: size ratio and CPU per value for zlib and zstd, against pylibmc's, side by side.

For a few sizes of two kinds of value (pickled rows, as a queryset cache holds,
and HTML text, as a page cache holds) it prints, per compressor:

* ratio: the bytes memcached holds (``mg <key> s``, read back from a real
  server) over the uncompressed encoding's bytes;
* compress / decompress: median CPU microseconds per value in our serde
  (``ValueSerde.serialize`` / ``deserialize`` minus the same without
  compression, so only compression is counted);
* for pylibmc (C, zlib level -1 = 6, ``min_compress_len``), the median extra
  microseconds a ``set`` / ``get`` on a loopback memcached takes with
  compression over without: its compression cost seen from Python.

Then it times a chunked value (``large_values="chunk"``) over the item limit:
set and get through the Cluster, and the round trips a get costs.

    python benchmarks/bench_values.py [--repeat 31]
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from django_mcpatterns.core.chunks import ChunkedStore
from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.serializers import SerdeOptions
from tests.drills.proxy import Proxy
from tests.harness import MemcachedServer, memcached_cluster, raw_client

SIZES = (1_000, 10_000, 100_000, 900_000)


def rows(size: int) -> Any:
    """Pickled dicts of a table, about ``size`` bytes once pickled."""
    out, i = [], 0
    while len(pickle.dumps(out, pickle.HIGHEST_PROTOCOL)) < size:
        out.extend(
            {"id": i + j, "name": f"user {i + j}", "mail": f"u{i + j}@example.org", "ok": True}
            for j in range(max(1, (size - 200) // 60 // 4))
        )
        i = len(out)
    return out


def html(size: int) -> str:
    row = '<tr class="row"><td><a href="/item/{0}/">Item {0}</a></td><td>{1}</td></tr>\n'
    parts, i = ["<html><body><table>\n"], 0
    while sum(map(len, parts)) < size:
        parts.append(row.format(i, i * 37 % 1000))
        i += 1
    return "".join(parts)[:size]


def median_us(call: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def stored_size(server: MemcachedServer, key: str) -> int:
    line = raw_client(server).raw_command(b"mg " + key.encode() + b" s", end_tokens=b"\r\n")
    return int(line.split()[1][1:])


def ours(server: MemcachedServer, value: Any, name: str, repeat: int) -> tuple[float, float, float]:
    plain = SerdeOptions().build()
    packed = SerdeOptions(compressor=name, compress_min_len=0).build()
    raw_data, raw_flags = plain.serialize(b"k", value)
    data, flags = packed.serialize(b"k", value)
    cluster = Cluster([server.spec], ClusterOptions(compressor=name, compress_min_len=0))
    cluster.set("bench", value)
    ratio = stored_size(server, "bench") / len(raw_data)
    compress = median_us(lambda: packed.serialize(b"k", value), repeat) - median_us(
        lambda: plain.serialize(b"k", value), repeat
    )
    decompress = median_us(lambda: packed.deserialize(b"k", data, flags), repeat) - median_us(
        lambda: plain.deserialize(b"k", raw_data, raw_flags), repeat
    )
    cluster.close()
    return ratio, compress, decompress


def pylibmcs(server: MemcachedServer, value: Any, repeat: int) -> tuple[float, float, float] | None:
    try:
        import pylibmc
    except ImportError:
        return None
    client = pylibmc.Client([server.spec])
    client.set("bench:raw", value)
    client.set("bench:z", value, min_compress_len=1)
    ratio = stored_size(server, "bench:z") / stored_size(server, "bench:raw")
    compress = median_us(lambda: client.set("bench:z", value, min_compress_len=1), repeat)
    compress -= median_us(lambda: client.set("bench:raw", value), repeat)
    decompress = median_us(lambda: client.get("bench:z"), repeat)
    decompress -= median_us(lambda: client.get("bench:raw"), repeat)
    return ratio, compress, decompress


def chunked(server: MemcachedServer, repeat: int) -> None:
    import os

    print("\nChunked values (large_values='chunk', item limit 1 MiB), over loopback:")
    print(f"{'size':>8} {'chunks':>6} {'set ms':>8} {'get ms':>8} {'get round trips':>16}")
    with Proxy(server.port) as proxy:
        cluster = Cluster([proxy.spec], ClusterOptions(large_values="chunk", timeout=5.0))
        store = ChunkedStore(cluster, cluster.options.max_item_size)
        for mib in (2, 4, 8):
            value = os.urandom(mib * 1024 * 1024)
            set_ms = median_us(lambda v=value: store.set("big", v), max(3, repeat // 5)) / 1000
            get_ms = median_us(lambda: store.get("big"), max(3, repeat // 5)) / 1000
            proxy.forget()
            assert store.get("big") == value
            trips = proxy.round_trips
            count = -(-len(value) // (1024 * 1024 - 200))
            print(f"{mib:>6}MB {count:>6} {set_ms:>8.1f} {get_ms:>8.1f} {trips:>16}")
        cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=31)
    args = parser.parse_args()
    with memcached_cluster(1) as (server,):
        print("Compression: stored size / uncompressed size, and CPU µs per value")
        print(
            f"{'value':>14} {'compressor':>10} {'ratio':>7} {'compress µs':>12} "
            f"{'decompress µs':>14}"
        )
        for kind, make in (("pickled rows", rows), ("html", html)):
            for size in SIZES:
                value = make(size)
                label = f"{kind[:6]} {size // 1000}KB"
                for name in ("zlib", "zstd"):
                    ratio, comp, decomp = ours(server, value, name, args.repeat)
                    print(f"{label:>14} {name:>10} {ratio:>7.1%} {comp:>12.0f} {decomp:>14.0f}")
                peer = pylibmcs(server, value, args.repeat)
                if peer is not None:
                    ratio, comp, decomp = peer
                    print(
                        f"{label:>14} {'pylibmc':>10} {ratio:>7.1%} {comp:>12.0f} {decomp:>14.0f}"
                    )
        chunked(server, args.repeat)


if __name__ == "__main__":
    main()
