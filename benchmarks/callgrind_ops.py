"""Instructions per operation under callgrind: a speed figure a busy machine cannot move.

Counts the user-space instructions (callgrind's ``Ir``) that one operation executes in
the client's process: ``get``, ``set``, ``get_many(100)`` and ``set_many(100)`` through our
``Cluster``, our ``AsyncCluster`` (one task, awaited one after another) and our Django
backend, with pylibmc and Django's ``PyLibMCCache`` beside them for reference.  Single-key
operations go to 1 server, multi-key ones to 4 (memcached with one worker thread each, run
natively: only the client is under valgrind).

How: this script starts the servers, then runs itself under
``valgrind --tool=callgrind --instr-atstart=no``.  That inner process connects and warms
every client (so setup and Python's specialising interpreter are out of the count), then
for each case counts a block of N operations between two callgrind client requests (zero
the counters, dump them: a tiny C stub, built here with gcc against valgrind's headers,
makes them), and the same block of N calls of a function that does nothing (the loop's
and the requests' own cost), and subtracts.  ``PYTHONHASHSEED=0`` keeps dict layouts the
same from run to run, and a collection before each block starts it from the same collector
state: two runs agree within 0.2 % (pylibmc within 3 %: how often libmemcached polls before
its reply is there varies).  Kernel time (the system calls) is not in the count:
bench_django.py counts system calls.

    python benchmarks/callgrind_ops.py [--ops 400] [--repeat 1] [--json out.json]
        [--compare before.json] [--only Cluster]

Needs valgrind and gcc (``apt-get install valgrind gcc``).  ``--compare`` prints each
case's ratio to a JSON written earlier by ``--json`` (e.g. before and after a change).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# operation -> servers: single-key operations on 1 server, multi-key ones on 4.
OPERATIONS = {"get": 1, "set": 1, "get_many(100)": 4, "set_many(100)": 4}
CLIENTS = ("Cluster", "AsyncCluster", "KetamaMemcacheCache", "pylibmc", "PyLibMCCache")

STUB = r"""
#include <valgrind/callgrind.h>
void bench_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void bench_zero(void) { CALLGRIND_ZERO_STATS; }
void bench_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
"""


# -- the outer process: servers, valgrind, the table ------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=400, help="single-key ops counted per case")
    parser.add_argument(
        "--repeat", type=int, default=1, help="valgrind runs (to show repeatability)"
    )
    parser.add_argument("--only", action="append", help="clients to count (default: all)")
    parser.add_argument("--json", type=Path, help="write the counts here")
    parser.add_argument("--compare", type=Path, help="a JSON from --json to print ratios to")
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(json.loads(args.inner))
        return

    require_tools()
    from tests.harness import memcached_cluster

    clients = [c for c in CLIENTS if not args.only or c in args.only]
    runs: list[dict[str, float]] = []
    with (
        memcached_cluster(5, extra_args=("-t", "1")) as servers,
        tempfile.TemporaryDirectory(prefix="callgrind-") as tmp,
    ):
        stub = build_stub(Path(tmp))
        plan = {
            "stub": str(stub),
            "one": [servers[0].spec],
            "four": [s.spec for s in servers[1:]],
            "clients": clients,
            "ops": args.ops,
        }
        for run in range(args.repeat):
            out = Path(tmp, f"run{run}")
            out.mkdir()
            runs.append(under_callgrind(plan, out))
    report(runs, args.ops, args.compare)
    if args.json:
        args.json.write_text(json.dumps({"ops": args.ops, "runs": runs}, indent=1))


def require_tools() -> None:
    """Exit with the install command when valgrind or gcc (for the stub) is missing."""
    for tool in ("valgrind", "gcc"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed: apt-get install -y valgrind gcc")


def build_stub(tmp: Path) -> Path:
    source, lib = tmp / "stub.c", tmp / "stub.so"
    source.write_text(STUB)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(source)], check=True)
    return lib


def run_under_callgrind(script: str, plan: dict[str, Any], out: Path) -> tuple[dict[str, int], str]:
    """Run ``script --inner plan`` under callgrind: instructions by dump label, and its stdout.

    The inner process labels each dump with callgrind's client request
    (``CALLGRIND_DUMP_STATS_AT``); the other callgrind scripts run through this too.
    """
    command = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}/callgrind.out",
        sys.executable,
        script,
        "--inner",
        json.dumps(plan),
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"valgrind run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    totals: dict[str, int] = {}
    for dump in out.glob("callgrind.out*"):
        text = dump.read_text(errors="replace")
        label = re.search(r"^desc: Trigger: Client Request: (\S+)", text, re.M)
        count = re.search(r"^(?:totals|summary): (\d+)", text, re.M)
        if label and count:
            totals[label.group(1)] = int(count.group(1))
    return totals, done.stdout


def under_callgrind(plan: dict[str, Any], out: Path) -> dict[str, float]:
    """Run the inner process under callgrind; instructions per op by case."""
    totals, stdout = run_under_callgrind(__file__, plan, out)
    counts = json.loads(stdout.strip().splitlines()[-1])  # the ops of each case
    return {
        case: (totals[f"{case}:ops"] - totals[f"{case}:idle"]) / ops for case, ops in counts.items()
    }


def report(runs: list[dict[str, float]], ops: int, compare: Path | None) -> None:
    before: dict[str, float] = {}
    print(f"Instructions per operation (callgrind Ir, client process, user space); {ops} ops")
    from django_mcpatterns.core.protocol import compiled  # as the inner process: same environment

    path = "compiled" if compiled.COMPILED else f"pure Python ({compiled.why_pure})"
    print(f"ours: the {path} hot path")
    if compare:
        earlier = json.loads(compare.read_text())
        old_runs = earlier["runs"]
        before = {case: statistics.median(r[case] for r in old_runs) for case in old_runs[0]}
        print(f"before: {compare} ({earlier['ops']} ops; the median of its runs)")
    header = f"{'client':<19} {'operation':<15} {'servers':>7} " + " ".join(
        f"{'run ' + str(i + 1):>10}" for i in range(len(runs))
    )
    if len(runs) > 1:
        header += f" {'spread':>7}"
    if before:
        header += f" {'before':>10} {'ratio':>6}"
    print(header)
    for case in runs[0]:
        client, op = case.split(":")
        values = [run[case] for run in runs]
        line = f"{client:<19} {op:<15} {OPERATIONS[op]:>7} " + " ".join(
            f"{v:>10,.0f}" for v in values
        )
        if len(runs) > 1:
            line += f" {(max(values) - min(values)) / min(values):>7.2%}"
        if case in before:
            now = statistics.median(values)
            line += f" {before[case]:>10,.0f} {now / before[case]:>6.3f}"
        print(line)


# -- the inner process, under callgrind ------------------------------------------------


def inner(plan: dict[str, Any]) -> None:
    import asyncio
    import gc

    lib = ctypes.CDLL(plan["stub"])
    lib.bench_dump.argtypes = [ctypes.c_char_p]
    loop = asyncio.new_event_loop()
    blocks: dict[str, tuple[Callable[[int], object], Callable[[int], object], int]] = {}
    for client in plan["clients"]:
        for op, n_servers in OPERATIONS.items():
            location = plan["one"] if n_servers == 1 else plan["four"]
            made = make_client(client, location)
            if made is None:
                continue
            ops = plan["ops"] if n_servers == 1 else max(plan["ops"] // 20, 10)
            blocks[f"{client}:{op}"] = (*operation(made, op, client, loop), ops)

    for run, idle, _ in blocks.values():  # warm: connections, caches, the adaptive interpreter
        run(50)
        idle(50)
    lib.bench_start()
    for case, (run, idle, ops) in blocks.items():
        for label, block in (("idle", idle), ("ops", run)):
            gc.collect()  # each block starts from the same collector state
            lib.bench_zero()
            block(ops)
            lib.bench_dump(f"{case}:{label}".encode())
    print(json.dumps({case: ops for case, (_, _, ops) in blocks.items()}))


_clients: dict[tuple[str, tuple[str, ...]], Any] = {}


def make_client(client: str, location: list[str]) -> Any:
    """The client (made once per client and servers), or None when it is not installed."""
    key = (client, tuple(location))
    if key not in _clients:
        _clients[key] = _make(client, location)
    return _clients[key]


def _make(client: str, location: list[str]) -> Any:
    if client == "Cluster":
        from django_mcpatterns.core.cluster import Cluster

        return Cluster(location)
    if client == "AsyncCluster":
        from django_mcpatterns.core.aio import AsyncCluster

        return AsyncCluster(location)
    try:
        import pylibmc
    except ImportError:
        pylibmc = None
    if client == "pylibmc":
        if pylibmc is None:
            return None
        return pylibmc.Client(location, binary=False, behaviors={"ketama_weighted": True})
    _django()
    if client == "KetamaMemcacheCache":
        from django_mcpatterns.backend import KetamaMemcacheCache

        return KetamaMemcacheCache(location, {})
    if pylibmc is None:
        return None
    from django.core.cache.backends.memcached import PyLibMCCache

    options = {"binary": False, "behaviors": {"ketama_weighted": True}}
    return PyLibMCCache(location, {"OPTIONS": options})


def _django() -> None:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(USE_TZ=True)
        django.setup()


Block = Callable[[int], object]


def operation(client: Any, op: str, name: str, loop: Any) -> tuple[Block, Block]:
    """Blocks of n calls of ``op`` on ``client``, and of n calls of a function doing nothing.

    AsyncCluster's block is one task awaiting the calls one after another.
    """
    value: Any = b"v" * 100 if name in ("Cluster", "AsyncCluster", "pylibmc") else "v" * 100
    batch = {f"bench:many:{i}": value for i in range(100)}
    keys = list(batch)
    multi = "_multi" if name == "pylibmc" else "_many"
    get_many, set_many = getattr(client, "get" + multi), getattr(client, "set" + multi)
    calls: dict[str, Callable[[], Any]] = {
        "get": lambda: client.get("bench:one"),
        "set": lambda: client.set("bench:one", value),
        "get_many(100)": lambda: get_many(keys),
        "set_many(100)": lambda: set_many(batch),
    }
    if name == "AsyncCluster":
        return _async_block(calls[op], calls, loop), _async_block(_nothing_async, calls, loop)
    calls["set"]()
    calls["set_many(100)"]()
    return _block(calls[op]), _block(_nothing)


def _nothing() -> None:
    pass


async def _nothing_async() -> None:
    pass


def _block(fn: Callable[[], object]) -> Block:
    def block(n: int) -> None:
        for _ in range(n):
            fn()

    return block


def _async_block(fn: Callable[[], Any], calls: dict[str, Callable[[], Any]], loop: Any) -> Block:
    async def setup() -> None:
        await calls["set"]()
        await calls["set_many(100)"]()

    async def awaited(n: int) -> None:
        for _ in range(n):
            await fn()

    loop.run_until_complete(setup())
    return lambda n: loop.run_until_complete(awaited(n))


if __name__ == "__main__":
    main()
