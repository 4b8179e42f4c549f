"""Instructions per operation of the near cache's workload, under callgrind (repeatable).

``bench_near.py`` times the workload on the machine's clock, which a busy machine moves;
this counts the client process's user-space instructions (callgrind's ``Ir``) instead, on
a fake clock, so that two runs agree whatever the load:

the mix
    The store-level workload of ``bench_near.py`` (Zipf s = 1.0 over ``--keys`` keys, 95 %
    ``get``, 5 % ``set`` of 100-byte str values, ``max_age`` 1 s) through ``NearStore``
    over a ``Cluster``, one thread, the table's clock advancing ``1 / --rate`` seconds per
    operation (the rate the 8-thread benchmark reaches).  ``--warm`` operations first,
    then ``--ops`` counted.  Cases: refresh ahead off and on.  Beside the instructions,
    the table's own counts over the counted operations: misses, keys refreshed ahead and
    round trips (misses and sets) per operation.
the mix through Django
    The same workload through Django's cache API (``cache.get``/``cache.set`` of a
    ``KetamaMemcacheCache`` with the near cache, refresh ahead on, the benchmark's
    path): key making and the backend's own layers included.
the operations
    A near hit, a near miss (every entry past its bound when read again), and a plain
    ``Cluster.get`` of a key memcached holds, for scale.

    python benchmarks/callgrind_near.py [--ops 10000] [--warm 80000] [--rate 80000]

Needs valgrind and gcc (``apt-get install valgrind gcc``).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from callgrind_ops import build_stub, require_tools, run_under_callgrind  # noqa: E402

MIX = {"refresh-ahead-off": None, "refresh-ahead-on": 0.5}  # labels: no spaces
DJANGO = "django-mix"
SINGLE = ("near-hit", "near-miss", "Cluster.get")
SINGLE_OPS = 2000
SPREAD = 5000  # keys the near-miss case cycles over


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=10_000, help="operations of the mix counted")
    parser.add_argument("--warm", type=int, default=80_000, help="operations before counting")
    parser.add_argument("--rate", type=float, default=80_000, help="operations per clock second")
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(json.loads(args.inner))
        return
    require_tools()
    from tests.harness import memcached_cluster

    with memcached_cluster(1) as servers, tempfile.TemporaryDirectory(prefix="cg-") as tmp:
        plan = {
            "stub": str(build_stub(Path(tmp))),
            "spec": servers[0].spec,
            "ops": args.ops,
            "warm": args.warm,
            "rate": args.rate,
            "keys": args.keys,
        }
        totals, stdout = run_under_callgrind(__file__, plan, Path(tmp))
    counts = json.loads(stdout.strip().splitlines()[-1])
    print(
        f"The near mix: Zipf s=1.0 over {args.keys:,} keys, 95% get / 5% set, max_age 1 s, "
        f"{args.rate:,.0f} ops per clock second; {args.warm:,} ops warm, {args.ops:,} counted"
    )
    print(f"  {'case':<20} {'Ir/op':>8} {'misses/op':>10} {'refreshed/op':>13} {'trips/op':>9}")
    for case in (*MIX, DJANGO):
        seen = counts[case]
        print(
            f"  {case:<20} {totals[case] / args.ops:>8,.0f} {seen['misses']:>10.4f}"
            f" {seen['refreshed']:>13.4f} {seen['trips']:>9.4f}"
        )
    print(f"One operation ({SINGLE_OPS:,} each):")
    for case in SINGLE:
        print(f"  {case:<20} {totals[case] / SINGLE_OPS:>8,.0f}")


class Clock:
    """The table's clock: moved by the workload, one step per operation."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay(
    store: Any,
    clock: Clock,
    keys: list[str],
    writes: list[bool],
    value: str,
    step: float,
    first: int,
    last: int,
) -> None:
    """Operations ``first`` to ``last`` of the workload, the clock moving ``step`` each."""
    for i in range(first, last):
        clock.now += step
        if writes[i]:
            store.set(keys[i], value)
        else:
            store.get(keys[i])


def inner(plan: dict[str, Any]) -> None:
    import bench_near

    from django_mcpatterns.core.client.cluster import Cluster
    from django_mcpatterns.core.near import NearOptions, NearStore, NearTable

    lib = ctypes.CDLL(plan["stub"])
    lib.bench_dump.argtypes = [ctypes.c_char_p]
    shape = argparse.Namespace(keys=plan["keys"], value_size=100, threads=1, writes=0.05)
    work = bench_near.Workload(shape)
    cluster = Cluster([plan["spec"]])
    for start in range(0, plan["keys"], 5000):
        cluster.set_many(dict.fromkeys(work.keys[start : start + 5000], work.value))
    keys, writes = work.plans[0]
    step, warm, ops = 1 / plan["rate"], plan["warm"], plan["ops"]
    lib.bench_start()
    counts: dict[str, dict[str, float]] = {}
    for case, ahead in MIX.items():
        clock = Clock()
        table = NearTable(NearOptions(1.0, 32 * 2**20, None, ahead), clock=clock)
        store = NearStore(cluster, table)
        mix = (store, clock, keys, writes, work.value, step)
        counts[case] = counted(mix, table, lib, case, warm, ops)
    counts[DJANGO] = through_django(plan, lib, work)
    clock = Clock()
    store = NearStore(cluster, NearTable(NearOptions(1.0), clock=clock))
    spread = work.keys[:SPREAD]

    def hits(n: int) -> None:
        for _ in range(n):
            store.get(spread[0])

    def misses(n: int) -> None:
        for i in range(n):
            clock.now += 1.01 / SPREAD  # each key past its bound when read again
            store.get(spread[i % SPREAD])

    def plain(n: int) -> None:
        for i in range(n):
            cluster.get(spread[i % SPREAD])

    for name, block in zip(SINGLE, (hits, misses, plain), strict=True):
        block(SPREAD + 1000)  # warm: every key read once, the hit's key held
        gc.collect()
        lib.bench_zero()
        block(SINGLE_OPS)
        lib.bench_dump(name.encode())
    print(json.dumps(counts))


def through_django(plan: dict[str, Any], lib: Any, work: Any) -> dict[str, float]:
    """The mix through Django's cache API (the benchmark's path), its table on the fake
    clock; the table's counts over the counted operations."""
    from django_mcpatterns.backend import KetamaMemcacheCache

    near = {"max_age": 1.0, "max_bytes": 32 * 2**20}
    cache = KetamaMemcacheCache([plan["spec"]], {"OPTIONS": {"near_cache": near}})
    for start in range(0, plan["keys"], 5000):
        cache.set_many(dict.fromkeys(work.keys[start : start + 5000], work.value), 3600)
    clock = Clock()
    table = cache.binding.near
    table.clock = clock
    keys, writes = work.plans[0]
    step, warm, ops = 1 / plan["rate"], plan["warm"], plan["ops"]
    mix = (cache, clock, keys, writes, work.value, step)
    return counted(mix, table, lib, DJANGO, warm, ops)


def counted(
    mix: tuple[Any, ...], table: Any, lib: Any, label: str, warm: int, ops: int
) -> dict[str, float]:
    """Replay ``warm`` operations of ``mix``, then ``ops`` counted under ``label``: the
    table's misses, keys refreshed ahead and round trips (misses and sets) per operation."""
    replay(*mix, 0, warm)
    before = table.stats()
    gc.collect()
    lib.bench_zero()
    replay(*mix, warm, warm + ops)
    lib.bench_dump(label.encode())
    after = table.stats()
    sets = sum(mix[3][warm : warm + ops])  # the plan's writes
    return {
        "misses": (after.misses - before.misses) / ops,
        "refreshed": (after.refreshed - before.refreshed) / ops,
        "trips": (after.misses - before.misses + sets) / ops,
    }


if __name__ == "__main__":
    main()
