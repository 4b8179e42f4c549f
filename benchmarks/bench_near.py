"""The near cache (``OPTIONS["near_cache"]``): throughput, requests, CPU per hit, memory.

Starts its own memcached on loopback and measures, in one process:

throughput
    A Zipf (s = 1.0) workload over ``--keys`` keys, 95 % ``get`` and 5 % ``set``, run
    by ``--threads`` threads through Django's cache API, one backend per thread as
    Django makes them, for ``--seconds`` a round (each thread reading on in its plan from
    where its last round stopped; ``--warm``, 1 s by default: seconds run before each
    round, not counted, so that a near table gone cold while the other contenders ran
    (about 6 s, past ``max_age``) is counted warm, as in a process that keeps serving;
    ``--warm 0`` counts each round from cold).  Contenders, interleaved (the order
    rotating each round): Django's ``PyLibMCCache`` (pylibmc, libmemcached's C client),
    ``KetamaMemcacheCache`` without a near cache and with one (``max_age``
    ``--max-age``).  Per contender: operations per second and memcached requests per
    operation (the server's own counters); per round, the ratios of the near cache's
    throughput to each other contender's, and their medians.
cpu per hit
    Process CPU time of a near hit, at the store level (``NearStore.get``) and through
    Django's API (``cache.get``), beside Django's own key making
    (``make_and_validate_key`` of ``PyLibMCCache``) and ours, interleaved.
memory
    A table of ``--memory-bytes`` filled past its bound with distinct values: the bytes
    it counts and the memory it holds (``tracemalloc``), against ``max_bytes``.

    python benchmarks/bench_near.py [--rounds 9] [--seconds 2] [--warm 1] [--threads 8]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import django
from django.conf import settings

settings.configure(USE_TZ=True)
django.setup()

from django.core.cache.backends.memcached import PyLibMCCache  # noqa: E402
from rounds import Figure, Sample, interleave, ratio, timed  # noqa: E402

from django_mcpatterns.backend import KetamaMemcacheCache  # noqa: E402
from django_mcpatterns.core.memory import MemoryStore  # noqa: E402
from django_mcpatterns.core.near import (  # noqa: E402
    ENTRY_OVERHEAD,
    NearOptions,
    NearStore,
    NearTable,
    keep,
)
from django_mcpatterns.core.protocol import compiled  # noqa: E402
from tests.harness import memcached_cluster, server_requests  # noqa: E402

SAMPLE = 200_000  # key choices drawn per thread before the rounds


def zipf_choices(n_keys: int, s: float, k: int, rng: random.Random) -> list[int]:
    """``k`` key indexes, key ``i`` (1-based rank) drawn with probability ∝ 1 / i**s."""
    weights = itertools.accumulate(1.0 / (i**s) for i in range(1, n_keys + 1))
    return rng.choices(range(n_keys), cum_weights=list(weights), k=k)


class Workload:
    """Each thread's precomputed keys and operations (drawn once, replayed in every round)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.keys = [f"near:{i}" for i in range(args.keys)]
        self.value = "v" * args.value_size
        self.plans: list[tuple[list[str], list[bool]]] = []
        for t in range(args.threads):
            rng = random.Random(t)
            chosen = zipf_choices(args.keys, 1.0, SAMPLE, rng)
            writes = [rng.random() < args.writes for _ in range(SAMPLE)]
            self.plans.append(([self.keys[i] for i in chosen], writes))
        # Where each thread's next round starts in its plan: each round picks up where the
        # last one stopped (a warm-up round, then the counted one, reads on).
        self.positions = [t * 7919 % SAMPLE for t in range(args.threads)]

    def round(self, make: Callable[[], Any], seconds: float) -> int:
        """Run every thread for ``seconds`` on a backend of its own; return the ops done."""
        done = [0] * len(self.plans)
        start = threading.Barrier(len(self.plans) + 1)
        deadline = [0.0]
        value = self.value

        def run(t: int) -> None:
            cache = make()
            keys, writes = self.plans[t]
            position = self.positions[t]
            start.wait()
            n = 0
            end = deadline[0]
            while True:
                for _ in range(64):
                    i = (position + n) % SAMPLE
                    if writes[i]:
                        cache.set(keys[i], value, 3600)
                    else:
                        cache.get(keys[i])
                    n += 1
                if time.perf_counter() >= end:
                    break
            done[t] = n
            self.positions[t] = (position + n) % SAMPLE

        threads = [threading.Thread(target=run, args=(t,)) for t in range(len(self.plans))]
        for thread in threads:
            thread.start()
        deadline[0] = time.perf_counter() + seconds
        start.wait()
        for thread in threads:
            thread.join()
        return sum(done)


def throughput(args: argparse.Namespace, location: list[str], servers: Any) -> None:
    near = {"max_age": args.max_age, "max_bytes": args.max_bytes}
    contenders: dict[str, Callable[[], Any]] = {
        "PyLibMCCache": lambda: PyLibMCCache(
            location, {"OPTIONS": {"binary": False, "behaviors": {"ketama_weighted": True}}}
        ),
        "ours": lambda: KetamaMemcacheCache(location, {}),
        "ours+near": lambda: KetamaMemcacheCache(location, {"OPTIONS": {"near_cache": near}}),
    }
    work = Workload(args)
    filler = KetamaMemcacheCache(location, {})
    for start in range(0, args.keys, 1000):
        filler.set_many(dict.fromkeys(work.keys[start : start + 1000], work.value), 3600)
    near_cache = KetamaMemcacheCache(location, {"OPTIONS": {"near_cache": near}})
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    requests: dict[str, list[float]] = {name: [] for name in contenders}
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    hit_ratios: list[float] = []
    names = list(contenders)
    for r in range(args.rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            if compiled.speedups is not None:  # each contender judged afresh (docs/near.md)
                compiled.speedups.look_first(None)
            if args.warm:  # not counted: a near table gone cold meanwhile holds its keys again
                work.round(contenders[name], args.warm)
            before = server_requests(servers)
            stats = near_cache.binding.near.stats() if name == "ours+near" else None
            began = time.process_time()
            ops = work.round(contenders[name], args.seconds)
            cpu[name].append((time.process_time() - began) / ops)
            sent = server_requests(servers) - before - 1  # the stats request itself
            rates[name].append(ops / args.seconds)
            requests[name].append(sent / ops)
            if stats is not None:
                after = near_cache.binding.near.stats()
                looked = (after.hits - stats.hits) + (after.misses - stats.misses)
                hit_ratios.append((after.hits - stats.hits) / looked if looked else 0.0)
        print(f"round {r + 1}: " + ", ".join(f"{n} {rates[n][-1]:,.0f}/s" for n in names))
    print(
        f"\nThroughput: {args.threads} threads, Zipf s=1.0 over {args.keys:,} keys, "
        f"{100 * (1 - args.writes):.0f}% get / {100 * args.writes:.0f}% set, values of "
        f"{args.value_size} bytes, near max_age {args.max_age} s; {args.rounds} rounds of "
        f"{args.seconds} s"
        + (f" (each after {args.warm} s not counted)" if args.warm else "")
        + ", interleaved; medians (25th-75th percentile)."
    )
    for name in names:
        rate = Figure.of(rates[name])
        per_op = Figure.of(requests[name])
        cpu_op = Figure.of(cpu[name]).scaled(1e6)
        print(
            f"  {name:<13} {rate.median:>10,.0f} ops/s ({rate.low:,.0f}-{rate.high:,.0f})"
            f"   memcached requests per op {per_op.median:.3f}"
            f"   CPU per op {cpu_op.median:.1f} µs ({cpu_op.low:.1f}-{cpu_op.high:.1f})"
        )
    for other in ("PyLibMCCache", "ours"):
        # A ratio of rates is the inverse of a ratio of times: ratio() takes times.
        times = ratio([1 / x for x in rates[other]], [1 / x for x in rates["ours+near"]])
        print(f"  ours+near / {other:<13} throughput {times.show()}")
        cpus = ratio(cpu[other], cpu["ours+near"])
        print(f"  {other:<13} / ours+near CPU per op {cpus.show()}")
    reduction = [
        1 - n / p for n, p in zip(requests["ours+near"], requests["PyLibMCCache"], strict=True)
    ]
    print(f"  requests saved against PyLibMCCache: {pct(Figure.of(reduction))}")
    print(f"  near hit ratio of the gets: {pct(Figure.of(hit_ratios))}")


def cpu_per_hit(args: argparse.Namespace, location: list[str]) -> None:
    ours = KetamaMemcacheCache(location, {"OPTIONS": {"near_cache": {"max_age": 3600}}})
    django_own = PyLibMCCache(location, {})
    ours.set("hot", "v" * args.value_size)
    ours.get("hot")  # held near from now on
    made = ours.make_and_validate_key("hot")
    values = ours.binding.near_values
    assert values.get(made) is not None
    assert ours.binding.near.stats().entries == 1
    ops = 20_000
    blocks: dict[str, Callable[[], Sample]] = {
        "store: NearStore.get (hit)": lambda: timed(lambda: values.get(made), ops),
        "django: cache.get (near hit)": lambda: timed(lambda: ours.get("hot"), ops),
        "django's key making": lambda: timed(lambda: django_own.make_and_validate_key("hot"), ops),
        "our key making": lambda: timed(lambda: ours.make_and_validate_key("hot"), ops),
    }
    samples = interleave(blocks, args.rounds * 3)
    print(f"\nCPU per operation (process time, µs; median of {args.rounds * 3} rounds):")
    for name, found in samples.items():
        cpu = Figure.of(s.cpu for s in found).scaled(1e6)
        print(f"  {name:<30} {cpu.median:6.2f} ({cpu.low:.2f}-{cpu.high:.2f})")
    hit, keys = samples["django: cache.get (near hit)"], samples["django's key making"]
    more = Figure.of(a.cpu - b.cpu for a, b in zip(hit, keys, strict=True)).scaled(1e6)
    print(f"  cache.get near hit minus Django's key making: {more.show()} µs")


def memory(args: argparse.Namespace) -> None:
    budget = args.memory_bytes
    kinds: dict[str, Callable[[int], Any]] = {
        "str of 100": lambda i: f"{i:08d}" + "v" * 92,
        "str of 2000": lambda i: f"{i:08d}" + "v" * 1992,
        "dict of 10": lambda i: {f"field{j}": i * 10 + j for j in range(10)},
        "list of dicts": lambda i: [{"id": i, "tags": ["a", "b"]}],
    }
    print(f"\nMemory: a near table of max_bytes {budget:,}, read 3x as many values as fit:")
    for kind, make in kinds.items():
        size = (keep(make(0)) or (None, None, 100))[2] + ENTRY_OVERHEAD + 50
        keys = [f"m:{i}" for i in range(3 * budget // size)]
        store = MemoryStore(max_bytes=64 * budget)
        for i, key in enumerate(keys):
            store.set(key, make(i))
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        table = NearTable(NearOptions(max_age=3600, max_bytes=budget))
        near = NearStore(store, table)
        for key in keys:
            near.get(key)
        gc.collect()
        measured = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        stats = table.stats()
        print(
            f"  {kind:<14} entries {stats.entries:>6,}  counted {stats.bytes:>10,}  "
            f"measured {measured:>10,}  = max_bytes {measured - budget:>+9,}"
        )


def pct(figure: Figure) -> str:
    return f"{100 * figure.median:.1f}% ({100 * figure.low:.1f}-{100 * figure.high:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seconds", type=float, default=2.0, help="per contender and round")
    parser.add_argument(
        "--warm",
        type=float,
        default=1.0,
        help="seconds each contender runs, not counted, before each of its rounds (0: the "
        "near table counted from cold in each round)",
    )
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--writes", type=float, default=0.05, help="the share of sets")
    parser.add_argument("--value-size", type=int, default=100)
    parser.add_argument("--max-age", type=float, default=1.0)
    parser.add_argument("--max-bytes", type=int, default=32 * 2**20)
    parser.add_argument("--memory-bytes", type=int, default=4 * 2**20)
    parser.add_argument("--server-threads", type=int, default=2, help="memcached's -t")
    parser.add_argument(
        "--only", choices=("throughput", "cpu", "memory"), help="run one section only"
    )
    args = parser.parse_args()
    if args.only in (None, "memory"):
        memory(args)
    if args.only == "memory":
        return
    with memcached_cluster(1, extra_args=("-t", str(args.server_threads))) as servers:
        location = [s.spec for s in servers]
        if args.only in (None, "cpu"):
            cpu_per_hit(args, location)
        if args.only in (None, "throughput"):
            throughput(args, location, servers)


if __name__ == "__main__":
    main()
