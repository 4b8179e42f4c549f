"""Lookups per second of Continuum.get_node against uhashring's ketama ring.

Run from the repository root: ``python benchmarks/bench_ketama.py [--keys N] [--passes P]``.
No servers are needed.  Every pass looks up keys never seen before (no memo can
help), both rings get the same node list and the same key objects, and the table
shows the best and the median pass.
"""

from __future__ import annotations

import argparse
import random
import statistics
import string
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# Run as a script from a checkout: make the package importable without installing it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from django_mcpatterns.core.ketama import Continuum

try:
    from uhashring import HashRing
except ImportError:  # pragma: no cover - optional comparison
    HashRing = None

Lookup = Callable[[str | bytes], object]


def fresh_keys(rng: random.Random, count: int, as_bytes: bool) -> list[str] | list[bytes]:
    """Distinct, cache-key-like keys ("user:<12 random chars>:<n>")."""
    alphabet = string.ascii_letters + string.digits
    keys = [f"user:{''.join(rng.choices(alphabet, k=12))}:{i}" for i in range(count)]
    return [k.encode() for k in keys] if as_bytes else keys


def rate(lookup: Lookup, keys: Sequence[str | bytes]) -> float:
    """Lookups per second over one pass."""
    start = time.perf_counter()
    for key in keys:
        lookup(key)
    return len(keys) / (time.perf_counter() - start)


def measure(
    lookups: dict[str, Lookup], as_bytes: bool, count: int, passes: int, seed: int
) -> dict[str, list[float]]:
    """Alternate the contenders within each pass so machine noise hits both alike."""
    rng = random.Random(seed)
    rates: dict[str, list[float]] = {name: [] for name in lookups}
    for _ in range(passes):
        for name, lookup in lookups.items():
            rates[name].append(rate(lookup, fresh_keys(rng, count, as_bytes)))
    return rates


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=50_000, help="keys per pass")
    parser.add_argument("--passes", type=int, default=7)
    args = parser.parse_args(argv)
    if HashRing is None:
        print("uhashring is not installed (pip install uhashring): showing Continuum only")

    header = (
        f"{'servers':>7} {'keys':>5} {'Continuum best':>15} {'median':>10} "
        f"{'uhashring best':>15} {'median':>10} {'ratio best':>10} {'median':>7}"
    )
    print(f"get_node lookups/s, {args.keys} fresh keys per pass, {args.passes} passes")
    print(header)
    print("-" * len(header))
    for count in (4, 10):
        nodes = [f"10.0.0.{i + 1}:11212" for i in range(count)]
        lookups: dict[str, Lookup] = {"ours": Continuum(nodes).get_node}
        if HashRing is not None:
            lookups["uhashring"] = HashRing(nodes, hash_fn="ketama").get_node
        for as_bytes in (False, True):
            rates = measure(lookups, as_bytes, args.keys, args.passes, seed=count)
            ours = rates["ours"]
            row = f"{count:>7} {'bytes' if as_bytes else 'str':>5} "
            row += f"{max(ours):>15,.0f} {statistics.median(ours):>10,.0f} "
            if "uhashring" in rates:
                theirs = rates["uhashring"]
                row += f"{max(theirs):>15,.0f} {statistics.median(theirs):>10,.0f} "
                row += f"{max(ours) / max(theirs):>9.2f}x "
                row += f"{statistics.median(ours) / statistics.median(theirs):>6.2f}x"
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
