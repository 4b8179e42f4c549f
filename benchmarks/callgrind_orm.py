"""Instructions per ORM read under callgrind: bench_orm's page query, uncached, warm and cold.

bench_orm.py's wall-clock ratios swing several-fold when the machine is busy; an
instruction count does not.  This script starts PostgreSQL and memcached (as
bench_orm.py does), loads the products, then runs itself under
``valgrind --tool=callgrind --instr-atstart=no``: the inner process reads the page
query (20 products of a category with their category) as ``uncached``
(``.nocache()``), ``warm`` (a hit) and ``cold`` (its result deleted first, so the
leased read, the query run as its plan's first miss compiled it, and the fill),
``first`` (cold, and the plans forgotten: the Query built, planned and compiled, as
a process's first read of it), spelled ``.cache()`` first (the chain
recorded: a warm hit builds no Query), ``warm_last`` and ``cold_last`` spelled
``.cache()`` last (Django builds the Query), and the deletion alone (``delete``,
taken off the cold cases), each case ``--ops`` times between two callgrind client requests.
Only the client process's user-space instructions count: the servers' work and
the kernel's (system calls, loopback) do not, so a round trip costs here what it
costs this process's interpreter, not its wait.  ``PYTHONHASHSEED=0``: two runs
agree within a fraction of a percent.

    python benchmarks/callgrind_orm.py [--ops 50] [--products 5000] [--json out.json]
        [--compare before.json]

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

import bench_orm  # noqa: E402
from callgrind_ops import build_stub, require_tools, run_under_callgrind  # noqa: E402

CASES = ("delete", "uncached", "warm", "cold", "first", "warm_last", "cold_last")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=50, help="reads counted per case")
    parser.add_argument("--products", type=int, default=5000)
    parser.add_argument("--json", type=Path, help="write the counts here")
    parser.add_argument("--compare", type=Path, help="a JSON from --json to print ratios to")
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(json.loads(args.inner))
        return
    require_tools()
    from django.db import connection

    from django_mcpatterns.orm.testing import installed
    from tests.harness import memcached_cluster
    from tests.orm.postgres import postgres

    with (
        postgres() as pg,
        memcached_cluster(1) as servers,
        tempfile.TemporaryDirectory(prefix="callgrind-orm-") as tmp,
    ):
        location = [s.spec for s in servers]
        bench_orm.setup(pg, location)
        with installed():
            bench_orm.load(args.products, 200)
        connection.close()
        plan = {
            "stub": str(build_stub(Path(tmp))),
            "database": pg.database_settings(),
            "location": location,
            "ops": args.ops,
        }
        counts = under_callgrind(plan, Path(tmp))
    report(counts, args.compare)
    if args.json:
        args.json.write_text(json.dumps(counts, indent=1))


def under_callgrind(plan: dict[str, Any], out: Path) -> dict[str, float]:
    """Run the inner process under callgrind; instructions per read by case."""
    totals, _ = run_under_callgrind(__file__, plan, out)
    counts = {case: total / plan["ops"] for case, total in totals.items()}
    counts["cold"] -= counts["delete"]  # the deletion that makes each read cold
    counts["cold_last"] -= counts["delete"]
    counts["first"] -= counts["delete"]
    return counts


def report(counts: dict[str, float], compare: Path | None) -> None:
    before = json.loads(compare.read_text()) if compare else None
    uncached = counts["uncached"]
    print("instructions per read (client process, user space):")
    for case in ("uncached", "warm", "cold", "first", "warm_last", "cold_last"):
        line = f"  {case:9} {counts[case]:>11,.0f}  {counts[case] / uncached:5.2f} of uncached"
        if before and case in before:
            line += f"  ({counts[case] / before[case]:.3f} of before)"
        print(line)
    print(
        f"warm (.cache() first, recorded): uncached / warm = {uncached / counts['warm']:.2f}; "
        f"cold adds {counts['cold'] - uncached:+,.0f} "
        f"({100 * (counts['cold'] / uncached - 1):+.1f}%)"
    )
    print(
        f"first (a query this process never read: planned, compiled): adds "
        f"{counts['first'] - uncached:+,.0f} ({100 * (counts['first'] / uncached - 1):+.1f}%)"
    )
    print(
        f"warm_last (.cache() last): uncached / warm = {uncached / counts['warm_last']:.2f}; "
        f"cold_last adds {counts['cold_last'] - uncached:+,.0f} "
        f"({100 * (counts['cold_last'] / uncached - 1):+.1f}%)"
    )


def inner(plan: dict[str, Any]) -> None:
    """Under callgrind: connect and warm every case, then count each one."""
    lib = ctypes.CDLL(plan["stub"])
    lib.bench_dump.argtypes = [ctypes.c_char_p]

    class Database:
        def database_settings(self) -> dict[str, Any]:
            settings: dict[str, Any] = plan["database"]
            return settings

    bench_orm.setup(Database(), plan["location"])
    from django_mcpatterns.orm.reads import reader
    from django_mcpatterns.orm.testing import installed
    from tests.orm.shop.models import Category

    with installed():
        category = Category.objects.nocache().order_by("pk")[1]
        bench_orm.page(category, True)
        values = reader().values
        key = bench_orm._plan(category).key

        def delete() -> None:
            values.delete(key)

        def cold() -> None:
            delete()
            bench_orm.page(category, True)

        def first() -> None:  # its plan (and statement) forgotten: as a process's first read
            delete()
            reader().forget()
            bench_orm.page(category, True)

        cases = {
            "delete": delete,
            "uncached": lambda: bench_orm.page(category, False),
            "warm": lambda: bench_orm.page(category, True),
            "cold": cold,
            "first": first,
            "warm_last": lambda: bench_orm.page(category, True, last=True),
            "cold_last": lambda: (delete(), bench_orm.page(category, True, last=True)),
        }
        for case in CASES:  # "warm" after "delete": its first read fills
            for _ in range(20):
                cases[case]()
        lib.bench_start()
        for case in CASES:
            run = cases[case]
            for _ in range(20):
                run()
            gc.collect()
            lib.bench_zero()
            for _ in range(plan["ops"]):
                run()
            lib.bench_dump(case.encode())


if __name__ == "__main__":
    main()
