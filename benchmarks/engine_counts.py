"""Instructions and system calls per operation of the client's hot path: counted, not timed.

Counts are repeatable on a busy machine where times are not.  Each case runs
in a child process twice, with a short and a long block of operations after
the same warm-up, under ``valgrind --tool=callgrind`` (instructions) or
``strace -f -c`` (system calls); the difference of the two runs divided by the
difference of their lengths is the cost of one operation, with start-up,
imports and connecting cancelled out.

    python benchmarks/engine_counts.py                 # both counts, every case
    python benchmarks/engine_counts.py --tool strace --case get

Cases: ``get``/``set`` (a 100-byte value, 1 server), ``get_many`` (100 keys on
4 servers), ``aget`` (AsyncCluster, one task, sequential gets), ``django_get``/
``django_set`` (through ``KetamaMemcacheCache``).  Servers run with ``-t 1``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = {
    "get": 1,
    "set": 1,
    "get_many": 4,
    "aget": 1,
    "django_get": 1,
    "django_set": 1,
}
WARM = 300
SHORT = {"valgrind": 200, "strace": 200}
LONG = {"valgrind": 1200, "strace": 2200}


def child(case: str, ops: int, specs: list[str]) -> None:
    """Warm up, then run ``ops`` operations of ``case`` and exit."""
    value = "v" * 100
    if case.startswith("django_"):
        import django
        from django.conf import settings

        settings.configure(USE_TZ=True)
        django.setup()
        from django_mcpatterns.backend import KetamaMemcacheCache

        cache = KetamaMemcacheCache(specs, {})
        cache.set("bench:one", value)
        op: Callable[[], Any] = (
            (lambda: cache.get("bench:one"))
            if case == "django_get"
            else (lambda: cache.set("bench:one", value))
        )
    elif case == "aget":
        import asyncio

        from django_mcpatterns.core.cluster import Cluster

        twin = Cluster(specs).aio

        async def run() -> None:
            await twin.set("bench:one", value)
            for _ in range(WARM + ops):
                await twin.get("bench:one")

        asyncio.run(run())
        return
    else:
        from django_mcpatterns.core.cluster import Cluster

        cluster = Cluster(specs)
        batch = {f"bench:many:{i}": value for i in range(100)}
        keys = list(batch)
        cluster.set("bench:one", value)
        cluster.set_many(batch)
        op = {
            "get": lambda: cluster.get("bench:one"),
            "set": lambda: cluster.set("bench:one", value),
            "get_many": lambda: cluster.get_many(keys),
        }[case]
    for _ in range(WARM):
        op()
    for _ in range(ops):
        op()


def count(tool: str, case: str, ops: int, specs: list[str]) -> int:
    """Instructions (callgrind) or system calls (strace) of one child run."""
    command = [sys.executable, __file__, "--child", case, str(ops), *specs]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        if tool == "valgrind":
            wrapper = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        else:
            wrapper = ["strace", "-f", "-c", "-o", str(out)]
        subprocess.run([*wrapper, *command], check=True, env=env, capture_output=True)
        text = out.read_text()
    if tool == "valgrind":
        found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
        assert found is not None, text[-500:]
        return int(found.group(1))
    # The last line: "100.00  <seconds>  <usecs/call>  <calls>  [<errors>]  total".
    total = text.strip().splitlines()[-1].split()
    assert total[-1] == "total", text
    return int(total[3])


def per_op(tool: str, case: str, specs: list[str]) -> float:
    short, long = SHORT[tool], LONG[tool]
    return (count(tool, case, long, specs) - count(tool, case, short, specs)) / (long - short)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", choices=["valgrind", "strace", "both"], default="both")
    parser.add_argument("--case", action="append", choices=list(CASES))
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        case, ops, *specs = args.child
        child(case, int(ops), specs)
        return

    from tests.harness import memcached_cluster

    tools = ["valgrind", "strace"] if args.tool == "both" else [args.tool]
    cases = args.case or list(CASES)
    print(f"{'case':<11} {'servers':>7} " + " ".join(f"{t + '/op':>14}" for t in tools))
    with memcached_cluster(4, extra_args=["-t", "1"]) as servers:
        specs = [server.spec for server in servers]
        for case in cases:
            used = specs[: CASES[case]]
            figures = [per_op(tool, case, used) for tool in tools]
            print(
                f"{case:<11} {len(used):>7} " + " ".join(f"{figure:>14,.1f}" for figure in figures),
                flush=True,
            )


if __name__ == "__main__":
    main()
