"""Django backends side by side: KetamaMemcacheCache vs PyMemcacheCache and PyLibMCCache.

Starts its own memcached servers on loopback (1 and 4), runs the same operations
through every backend in one process, interleaved, and prints the time per
operation and the ratios ours/theirs (lower is better).  PyLibMCCache (pylibmc,
libmemcached's C client: the speed target) is left out when pylibmc is missing.
Many short rounds, interleaved, and their median: a machine shared with other
work slows every backend alike instead of one whole column.

    python benchmarks/bench_django.py [--rounds 21] [--ops 600]
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

import django
from django.conf import settings

settings.configure(USE_TZ=True)
django.setup()

from django.core.cache.backends.memcached import PyLibMCCache, PyMemcacheCache  # noqa: E402

from django_mcpatterns.backend import KetamaMemcacheCache  # noqa: E402
from tests.harness import memcached_cluster  # noqa: E402


def per_op(fn: Callable[[int], object], ops: int) -> float:
    """Seconds per call of ``fn`` over ``ops`` calls."""
    start = time.perf_counter()
    for i in range(ops):
        fn(i)
    return (time.perf_counter() - start) / ops


def measure(cases: dict[str, Callable[[int], object]], ops: int, rounds: int) -> dict[str, float]:
    """Median seconds per op of each case; the cases run interleaved, round by round."""
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            samples[name].append(per_op(fn, ops))
    return {name: statistics.median(values) for name, values in samples.items()}


def workload(cache, n_keys: int = 100) -> dict[str, Callable[[int], object]]:
    value = "v" * 100
    batch = {f"bench:many:{i}": value for i in range(n_keys)}
    keys = list(batch)
    cache.set("bench:one", value)
    cache.set_many(batch)
    return {
        "get": lambda i: cache.get("bench:one"),
        "set": lambda i: cache.set("bench:one", value),
        f"get_many({n_keys})": lambda i: cache.get_many(keys),
        f"set_many({n_keys})": lambda i: cache.set_many(batch),
    }


# The targets (issue 13): ratio ours/theirs at most this, per (servers, operation).
TARGETS = {
    "PyLibMCCache": {
        (1, "get"): 1.10,
        (1, "set"): 1.10,
        (4, "get_many(100)"): 1.00,
        (4, "set_many(100)"): 1.00,
    },
    # Where ours was already at most 0.8x before (the multi-key operations): it stays so.
    "PyMemcacheCache": {(n, op): 0.8 for n in (1, 4) for op in ("get_many(100)", "set_many(100)")},
}


def verdicts(n_servers: int, op: str, result: dict[str, float]) -> str:
    """The targets this row has, each with ok or MISSED."""
    out = []
    for peer, limits in TARGETS.items():
        limit = limits.get((n_servers, op))
        if limit is not None and peer in result:
            ok = result["ours"] / result[peer] <= limit
            out.append(f"{peer.removesuffix('Cache')} <= {limit:.2f} {'ok' if ok else 'MISSED'}")
    return ", ".join(out)


def has_pylibmc() -> bool:
    try:
        import pylibmc  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--ops", type=int, default=600, help="single-key ops per round")
    args = parser.parse_args()

    peers: dict[str, Callable[[list[str]], Any]] = {
        "PyMemcacheCache": lambda location: PyMemcacheCache(location, {}),
    }
    if has_pylibmc():
        # Django's defaults for pylibmc (text protocol, libmemcached's default behaviors),
        # except the distribution: libmemcached's weighted ketama, ours by default, so that
        # 4 servers get the same keys on both sides (its default, modula, is not consistent).
        peers["PyLibMCCache"] = lambda location: PyLibMCCache(
            location, {"OPTIONS": {"binary": False, "behaviors": {"ketama_weighted": True}}}
        )
    rows = []
    for n_servers in (1, 4):
        # One worker thread per memcached: a connection's speed here depends on which of
        # memcached's worker threads serves it (on a 2-core machine, 20 or 60 µs a get,
        # whatever the client), and connections are dealt to the threads in turn. With one
        # thread every backend's connection is served alike, so the ratios compare clients.
        with memcached_cluster(n_servers, extra_args=("-t", "1")) as servers:
            location = [s.spec for s in servers]
            backends = {"ours": KetamaMemcacheCache(location, {})}
            backends.update({name: make(location) for name, make in peers.items()})
            cases = {name: workload(cache) for name, cache in backends.items()}
            for op in cases["ours"]:
                ops = args.ops if "many" not in op else max(args.ops // 20, 50)
                result = measure({name: cases[name][op] for name in backends}, ops, args.rounds)
                rows.append((n_servers, op, result))

    header = f"{'servers':>7}  {'operation':<14} {'ours µs':>9}"
    for name in peers:
        header += f" {name + ' µs':>19} {'ratio':>6}"
    print(header + "  targets")
    for n_servers, op, result in rows:
        line = f"{n_servers:>7}  {op:<14} {result['ours'] * 1e6:>9.1f}"
        for name in peers:
            line += f" {result[name] * 1e6:>19.1f} {result['ours'] / result[name]:>6.2f}"
        print(line + "  " + verdicts(n_servers, op, result))


if __name__ == "__main__":
    main()
