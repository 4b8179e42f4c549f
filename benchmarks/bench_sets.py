"""Append-based sets vs the obvious alternatives, on real memcached servers.

Starts its own memcached on loopback and measures:

1. ``sadd`` throughput with 8 processes adding to one key at once, against a
   naive set (``gets`` a pickled Python set, add the member, ``cas`` it back,
   retry when another process won).  Target: >= 3x.
2. ``cache.smembers`` of a 100,000-member set against ``cache.get`` of a
   pickled Python set of the same members, through the Django backend, timed
   interleaved round by round (median).  Target: <= 2x the time.
3. Requests per operation, read from memcached's own ``stats`` counters.
   Target: sadd/srem 1, smembers 1.
4. asyncio: 50 tasks doing ``sadd`` + ``sismember`` on sets of their own through
   ``AsyncAppendSets`` over the cluster's AsyncCluster twin, against the same
   work through the sync ``AppendSets`` in one thread (operations per second).

    python benchmarks/bench_sets.py [--seconds 3] [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.sets import AppendSets, AsyncAppendSets
from tests.harness import MemcachedServer, memcached_cluster, server_counters

PROCESSES = 8
POOL = 2000  # members each process draws from
WIRE = ("cmd_get", "cmd_set", "cmd_touch")  # the counters a request moves


def append_sadd(sets: AppendSets, key: str, member: str) -> None:
    sets.sadd(key, member)


def naive_sadd(cluster: Cluster, key: str, member: str) -> None:
    """The get-modify-cas set: read the whole pickled set, write it back if unchanged."""
    while True:
        value, token = cluster.gets(key)
        if value is None:
            if cluster.add(key, {member}):
                return
            continue
        value.add(member)
        if cluster.cas(key, value, token):
            return


def adder(spec: str, method: str, seconds: float, index: int) -> int:
    """One process: add random members for ``seconds``; return how many adds it made."""
    cluster = Cluster([spec])
    sets = AppendSets(cluster)
    add: Callable[[str, str], None] = (
        functools.partial(append_sadd, sets)
        if method == "append"
        else functools.partial(naive_sadd, cluster)
    )
    rng = random.Random(index)
    key = f"bench:{method}"
    done = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        add(key, f"p{index}:{rng.randrange(POOL)}")
        done += 1
    cluster.close()
    return done


def throughput(spec: str, method: str, seconds: float) -> float:
    context = multiprocessing.get_context("fork")
    with context.Pool(PROCESSES) as pool:
        counts = pool.map(functools.partial(adder, spec, method, seconds), range(PROCESSES))
    return sum(counts) / seconds


def django_cache(spec: str) -> Any:
    import django
    from django.conf import settings

    settings.configure(
        CACHES={
            "default": {
                "BACKEND": "django_mcpatterns.backend.KetamaMemcacheCache",
                "LOCATION": [spec],
                "TIMEOUT": None,
            }
        },
        INSTALLED_APPS=["django_mcpatterns"],
    )
    django.setup()
    from django.core.cache import cache

    return cache


def timed(fn: Callable[[], object], repeat: int = 5) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def read_ratio(cache: Any, label: str, members: list[Any], rounds: int) -> float:
    cache.set(f"pickled:{label}", set(members))
    for start in range(0, len(members), 10_000):
        cache.sadd(f"appended:{label}", *members[start : start + 10_000])
    expected = set(members)
    assert cache.smembers(f"appended:{label}") == expected  # this read compacts it
    assert cache.get(f"pickled:{label}") == expected, "the pickled set did not fit in an item"
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(timed(lambda: cache.smembers(f"appended:{label}")))
        theirs.append(timed(lambda: cache.get(f"pickled:{label}")))
    mine, other = statistics.median(ours), statistics.median(theirs)
    print(
        f"  smembers vs get, 100,000 {label:<14} {mine * 1e3:7.2f} ms vs {other * 1e3:7.2f} ms"
        f"  ratio {mine / other:.2f}  (target <= 2.00)"
    )
    return mine / other


def requests(cache: Any, server: MemcachedServer) -> dict[str, int]:
    counts = {}
    cache.sadd("req", "seed")
    cache.smembers("req")
    operations: dict[str, Callable[[], object]] = {
        "sadd (1 member)": lambda: cache.sadd("req", "a"),
        "sadd (1,000 members)": lambda: cache.sadd("req", *range(1000)),
        "srem (500 members)": lambda: cache.srem("req", *range(500)),
        "smembers (after writes: compacts)": lambda: cache.smembers("req"),
        "smembers": lambda: cache.smembers("req"),
        "sismember": lambda: cache.sismember("req", "a"),
        "scard": lambda: cache.scard("req"),
        "sadd to a missing set": lambda: cache.sadd("req:new", "a"),
    }
    for name, operation in operations.items():
        before = server_counters([server], WIRE)
        operation()
        after = server_counters([server], WIRE)
        counts[name] = sum(after[k] - before[k] for k in after)
        print(f"  {name:<36} {counts[name]} request(s)")
    return counts


TASKS = 50
MEMBERS = 20  # small sets: the requests are measured, not the decoding of a growing log


def sync_rate(spec: str, seconds: float) -> float:
    """sadd + sismember in one thread: operations per second."""
    cluster = Cluster([spec])
    sets = AppendSets(cluster)
    done = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        key = f"sync:{done % TASKS}"
        sets.sadd(key, done % MEMBERS)
        sets.sismember(key, done % MEMBERS)
        done += 2
    cluster.close()
    return done / seconds


def async_rate(spec: str, seconds: float) -> float:
    """The same work from 50 tasks of one event loop: operations per second."""
    cluster = Cluster([spec])
    sets = AsyncAppendSets(cluster.aio)
    counts = [0] * TASKS

    async def task(index: int, deadline: float) -> None:
        key = f"async:{index}"
        while time.perf_counter() < deadline:
            await sets.sadd(key, counts[index] % MEMBERS)
            await sets.sismember(key, counts[index] % MEMBERS)
            counts[index] += 2

    async def run() -> None:
        deadline = time.perf_counter() + seconds
        await asyncio.gather(*(task(index, deadline) for index in range(TASKS)))

    asyncio.run(run())
    cluster.close()
    return sum(counts) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per throughput run")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved read rounds")
    args = parser.parse_args()
    failures = 0
    with memcached_cluster(1) as (server,):
        print(f"sadd throughput, {PROCESSES} processes on one key ({args.seconds:.0f} s each):")
        naive = throughput(server.spec, "naive", args.seconds)
        ours = throughput(server.spec, "append", args.seconds)
        ratio = ours / naive
        failures += ratio < 3
        print(
            f"  append-based {ours:9.0f} adds/s   naive gets+cas {naive:9.0f} adds/s"
            f"   ratio {ratio:.1f}x  (target >= 3x)"
        )

        cache = django_cache(server.spec)
        print("smembers of a 100,000-member set vs cache.get of a pickled set:")
        failures += read_ratio(cache, "ints", list(range(100_000)), args.rounds) > 2
        short = [f"u{i:x}" for i in range(100_000)]
        failures += read_ratio(cache, "short-strs", short, args.rounds) > 2

        print("requests per operation (memcached cmd_get + cmd_set + cmd_touch):")
        counts = requests(cache, server)
        steady = ("sadd (1 member)", "sadd (1,000 members)", "srem (500 members)", "smembers")
        failures += any(counts[name] != 1 for name in steady)

        print(f"asyncio, {TASKS} tasks (sadd + sismember) vs the sync API in one thread:")
        ours_sync = sync_rate(server.spec, args.seconds)
        ours_async = async_rate(server.spec, args.seconds)
        print(
            f"  AsyncAppendSets {ours_async:9.0f} ops/s   AppendSets {ours_sync:9.0f} ops/s"
            f"   ratio {ours_async / ours_sync:.1f}x"
        )
    print("all targets met" if not failures else f"{failures} target(s) missed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
