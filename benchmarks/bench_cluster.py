"""Cluster vs pymemcache's HashClient, side by side on the same servers.

Starts its own memcached servers on loopback (1, then 4) and runs get, set,
get_many(100) and set_many(100) through our ``Cluster`` and through a
``HashClient`` configured as Django's ``PyMemcacheCache`` configures it
(pooled, replies on, ``pickle_serde``), interleaved round by round.  Prints the
median time per operation and the ratio ours/theirs (lower is better).

Targets: get_many/set_many(100) on 4 servers <= 0.8x, get/set on 1 server <= 1.10x.

    python benchmarks/bench_cluster.py [--rounds 9] [--ops 3000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pymemcache import HashClient
from pymemcache.serde import pickle_serde

from django_mcpatterns.core.cluster import Cluster
from tests.harness import memcached_cluster

TARGETS = {(1, "get"): 1.10, (1, "set"): 1.10, (4, "get_many(100)"): 0.8, (4, "set_many(100)"): 0.8}


def per_op(fn: Callable[[], object], ops: int) -> float:
    start = time.perf_counter()
    for _ in range(ops):
        fn()
    return (time.perf_counter() - start) / ops


def workload(client: Any, n_keys: int = 100) -> dict[str, Callable[[], object]]:
    value = "v" * 100
    batch = {f"bench:many:{i}": value for i in range(n_keys)}
    keys = list(batch)
    client.set("bench:one", value)
    client.set_many(batch)
    return {
        "get": lambda: client.get("bench:one"),
        "set": lambda: client.set("bench:one", value),
        f"get_many({n_keys})": lambda: client.get_many(keys),
        f"set_many({n_keys})": lambda: client.set_many(batch),
    }


def compare(ours: Callable[[], object], theirs: Callable[[], object], ops: int, rounds: int):
    """Median seconds per op of each, measured interleaved so drift hits both alike."""
    mine: list[float] = []
    other: list[float] = []
    for _ in range(rounds):
        mine.append(per_op(ours, ops))
        other.append(per_op(theirs, ops))
    return statistics.median(mine), statistics.median(other)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--ops", type=int, default=3000, help="single-key ops per round")
    args = parser.parse_args()

    print(
        f"{'servers':>7} {'operation':<15} {'Cluster':>10} {'HashClient':>11} {'ratio':>6}  target"
    )
    failures = 0
    for n_servers in (1, 4):
        with memcached_cluster(n_servers) as servers:
            specs = [s.spec for s in servers]
            cluster = Cluster(specs)
            hash_client = HashClient(
                specs,
                use_pooling=True,
                default_noreply=False,
                serde=pickle_serde,
                allow_unicode_keys=True,
            )
            ours, theirs = workload(cluster), workload(hash_client)
            for op in ours:
                ops = args.ops if "many" not in op else max(args.ops // 20, 50)
                mine, other = compare(ours[op], theirs[op], ops, args.rounds)
                ratio = mine / other
                target = TARGETS.get((n_servers, op))
                verdict = ""
                if target is not None:
                    ok = ratio <= target
                    failures += not ok
                    verdict = f"<= {target:.2f} {'ok' if ok else 'MISSED'}"
                print(
                    f"{n_servers:>7} {op:<15} {mine * 1e6:>8.1f}us {other * 1e6:>9.1f}us "
                    f"{ratio:>6.2f}  {verdict}"
                )
            cluster.close()
            hash_client.close()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
