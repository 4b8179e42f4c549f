"""Client level, side by side: our Cluster and AsyncCluster against the Python memcached clients.

Starts one memcached on loopback (one worker thread: ``-t 1``) and runs, in one process,
interleaved round by round (the order rotating), the same cases through every client:

* sync, one thread: ``get`` of a 100-byte value, ``set`` of it, ``get_many(100)``
  (time per op and process CPU per op): our ``Cluster``, pylibmc (libmemcached, C),
  pymemcache, meta-memcache (RevenueCat's, with its Rust socket layer
  meta-memcache-socket);
* 8 threads on the one server, gets/s: our ``Cluster`` shared by the threads (as our
  Django backend shares it), pylibmc one client per thread (``clone()``, as its docs
  advise), pymemcache one ``Client`` per thread (it is not thread-safe), meta-memcache
  one client shared (thread-safe, its pool sized for the threads);
* asyncio, 50 tasks x 200 gets of distinct keys, gets/s; and one task awaiting gets one
  after another (time per get): our ``AsyncCluster``, aiomcache, emcache with its
  autobatching on and off.

Every figure is the median of the rounds with its spread (25th-75th percentile); a ratio
is ours over theirs round by round, then its median.  Each client stores and reads its
own keys with its own defaults unless said; values are bytes, which every client stores
as they are.  A peer that is not installed is reported and left out.  The peers are
benchmark-only dependencies: ``pip install -e ".[bench]"`` (pylibmc must be built from
source on Debian's libmemcached: ``--no-binary pylibmc``, see the interop extra).

    python benchmarks/bench_clients.py [--rounds 9] [--ops 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clients import (
    ASYNC_PEERS,
    INSTALL,
    MANY,
    SYNC_PEERS,
    TASK_GETS,
    TASKS,
    THREADS,
    AsyncClient,
    ours_async,
    ours_sync,
)
from rounds import Figure, Sample, interleave, ratio, timed

from django_mcpatterns.core.protocol import compiled
from tests.harness import memcached_cluster


@dataclass
class Case:
    """One case's samples by contender, and how to read them."""

    title: str
    unit: str  # "µs" (time per op, lower is better) or "gets/s" (higher is better)
    ours: str
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    goal: tuple[str, float] | None = None  # (peer, ratio limit) from issue 25

    def figure(self, name: str, cpu: bool = False) -> Figure:
        per_op = Figure.of(s.cpu if cpu else s.wall for s in self.samples[name])
        return per_op.scaled(1e6) if self.unit == "µs" or cpu else per_op.inverted()

    def ratio(self, peer: str) -> Figure:
        """Ours against ``peer``: time ratio (lower is better) or throughput ratio (higher)."""
        mine, theirs = (
            [s.wall for s in self.samples[self.ours]],
            [s.wall for s in self.samples[peer]],
        )
        return ratio(mine, theirs) if self.unit == "µs" else ratio(theirs, mine)

    def fastest_peer(self) -> str | None:
        peers = [n for n in self.samples if n != self.ours]
        if not peers:
            return None
        return min(peers, key=lambda n: Figure.of(s.wall for s in self.samples[n]).median)


# -- the measured blocks ----------------------------------------------------------------


def threaded(gets: list[Callable[[], object]], ops: int) -> Sample:
    """Each function called ``ops`` times in its own thread, all started together."""
    start = threading.Barrier(len(gets) + 1)

    def work(get: Callable[[], object]) -> None:
        start.wait()
        for _ in range(ops):
            get()

    threads = [threading.Thread(target=work, args=(get,)) for get in gets]
    for thread in threads:
        thread.start()
    start.wait()
    wall, cpu = time.perf_counter(), time.process_time()
    for thread in threads:
        thread.join()
    cpu = time.process_time() - cpu
    wall = time.perf_counter() - wall
    total = ops * len(gets)
    return Sample(wall / total, cpu / total)


def tasks_block(loop: asyncio.AbstractEventLoop, client: AsyncClient) -> Sample:
    """50 tasks, each awaiting 200 gets of its own keys one after another."""
    chunks = [client.distinct[i * TASK_GETS : (i + 1) * TASK_GETS] for i in range(TASKS)]

    async def task(keys: list[Any]) -> None:
        for key in keys:
            await client.get(key)

    async def run() -> Sample:
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(task(chunk) for chunk in chunks))
        cpu = time.process_time() - cpu
        wall = time.perf_counter() - wall
        return Sample(wall / (TASKS * TASK_GETS), cpu / (TASKS * TASK_GETS))

    return loop.run_until_complete(run())


def sequential_block(loop: asyncio.AbstractEventLoop, client: AsyncClient, ops: int) -> Sample:
    """One task awaiting ``ops`` gets of one key, one after another."""

    async def run() -> Sample:
        get, key = client.get, client.one
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(ops):
            await get(key)
        cpu = time.process_time() - cpu
        wall = time.perf_counter() - wall
        return Sample(wall / ops, cpu / ops)

    return loop.run_until_complete(run())


# -- the run and the report --------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="at least 7")
    parser.add_argument("--ops", type=int, default=2000, help="single-key ops per block")
    parser.add_argument("--json", type=Path, help="also write every round's samples here")
    args = parser.parse_args()
    many_ops = max(args.ops // 20, 20)
    thread_ops = max(args.ops // 4, 100)

    print(conditions())
    missing: list[str] = []
    cases: list[Case] = []
    with memcached_cluster(1, extra_args=("-t", "1")) as servers:
        spec = servers[0].spec
        sync = {"ours Cluster": ours_sync(spec)}
        for peer, make in SYNC_PEERS.items():
            client = contender(peer, lambda make=make: make(spec), missing)
            if client is not None:
                sync[client.name] = client
        sync = {name: c for name, c in sync.items() if checked(c.name, c.check, missing)}
        print_configs({c.name: c.config for c in sync.values()})

        def run(case: Case, blocks: dict[str, Callable[[], Sample]]) -> None:
            errors: dict[str, str] = {}
            interleave(blocks, 1, errors)  # warm: connections, the adaptive interpreter
            blocks = {name: b for name, b in blocks.items() if name not in errors}
            case.samples = interleave(blocks, args.rounds, errors)
            for name, error in errors.items():
                missing.append(f"{name}: failed in {case.title} ({error}): left out of it")
            if case.ours in case.samples:
                cases.append(case)
            print_case(case)

        ours = "ours Cluster"
        for title, op, ops, limit in (
            ("get, 100-byte value", "get", args.ops, 1.2),
            ("set, 100-byte value", "set", args.ops, 1.2),
            (f"get_many({MANY})", "get_many", many_ops, 1.5),
        ):
            blocks = {name: partial(timed, getattr(c, op), ops) for name, c in sync.items()}
            run(Case(title, "µs", ours, goal=("pylibmc", limit)), blocks)
        gets = {name: c.thread_gets(THREADS) for name, c in sync.items()}
        run(
            Case(f"{THREADS} threads on one server", "gets/s", ours, goal=("pylibmc", 0.8)),
            {name: (lambda g=g: threaded(g, thread_ops)) for name, g in gets.items()},
        )

        loop = asyncio.new_event_loop()
        made = {"ours AsyncCluster": loop.run_until_complete(ours_async(spec))}
        for peer, make_async in ASYNC_PEERS:
            client = contender(peer, lambda m=make_async: loop.run_until_complete(m(spec)), missing)
            if client is not None:
                made[client.name] = client
        aio = {
            name: c
            for name, c in made.items()
            if checked(name, lambda c=c: loop.run_until_complete(c.check()), missing)
        }
        print_configs({c.name: c.config for c in aio.values()})
        ours = "ours AsyncCluster"
        run(
            Case(
                f"asyncio, {TASKS} tasks x {TASK_GETS} distinct gets",
                "gets/s",
                ours,
                goal=("emcache batching on", 1.0),
            ),
            {name: (lambda c=c: tasks_block(loop, c)) for name, c in aio.items()},
        )
        run(
            Case("asyncio, one task, sequential get", "µs", ours, goal=("fastest", 1.1)),
            {name: (lambda c=c: sequential_block(loop, c, args.ops)) for name, c in aio.items()},
        )
        for c in made.values():
            loop.run_until_complete(c.close())
        leftover = asyncio.all_tasks(loop)  # emcache's event dispatchers
        for task in leftover:
            task.cancel()
        loop.run_until_complete(settle(leftover))
        loop.close()

    print_summary(cases, args.rounds)
    for line in missing:
        print(line)
    print(conditions(short=True))
    if args.json:
        dump = [
            {
                "case": c.title,
                "unit": c.unit,
                "samples": {k: [(s.wall, s.cpu) for s in v] for k, v in c.samples.items()},
            }
            for c in cases
        ]
        args.json.write_text(json.dumps(dump, indent=1))


async def settle(tasks: set[asyncio.Task[Any]]) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)


def contender(name: str, make: Callable[[], Any], missing: list[str]) -> Any:
    """``make()``, or None with a note when the peer is not installed."""
    try:
        return make()
    except ImportError as exc:
        note = f"{name}: not installed ({exc}); {INSTALL[name]}"
        if note not in missing:
            missing.append(note)
        return None


def checked(name: str, check: Callable[[], bool], missing: list[str]) -> bool:
    """Whether a contender reads back what it stored (a miss is not a get worth timing)."""
    ok = check()
    if not ok:
        missing.append(f"{name}: did not read back its values: left out")
    return ok


def conditions(short: bool = False) -> str:
    load = "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    if short:
        return f"at the end: {load}"
    try:
        memcached = subprocess.run(
            ["memcached", "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        memcached = "memcached ?"
    cores = os.cpu_count()
    path = "compiled" if compiled.COMPILED else f"pure Python ({compiled.why_pure})"
    return (
        f"Python {sys.version.split()[0]}, {memcached} (-t 1) on loopback, {cores} cores, {load}"
        f"\nours: the {path} hot path"
    )


def print_configs(configs: dict[str, str]) -> None:
    for name, config in configs.items():
        print(f"  {name:<22} {config}")
    print()


def print_case(case: Case) -> None:
    better = "lower" if case.unit == "µs" else "higher"
    unit = "µs per op" if case.unit == "µs" else "gets/s"
    print(f"{case.title}: {unit} ({better} is better), CPU µs per op; median (25th-75th pct)")
    print(f"  {'contender':<22} {unit:>24} {'CPU µs':>22} {'ours/them':>18}")
    for name in case.samples:
        digits = 1 if case.unit == "µs" else 0
        line = f"  {name:<22} {case.figure(name).show(digits):>24}"
        line += f" {case.figure(name, cpu=True).show(1):>22}"
        if name != case.ours and case.ours in case.samples:
            line += f" {case.ratio(name).show():>18}"
        print(line)
    print()


def print_summary(cases: list[Case], rounds: int) -> None:
    print(f"Summary: ours against the fastest peer, medians of {rounds} interleaved rounds")
    print(f"  {'case':<46} {'ours':>9} {'fastest peer':>28} {'ratio (spread)':>17}  goal")
    for case in cases:
        digits = 1 if case.unit == "µs" else 0
        title = f"{case.title} ({case.unit})"
        ours = f"{case.figure(case.ours).median:.{digits}f}"
        peer = case.fastest_peer()
        if peer is None:
            print(f"  {title:<46} {ours:>9}   (no peer)")
            continue
        theirs = f"{peer} {case.figure(peer).median:.{digits}f}"
        print(
            f"  {title:<46} {ours:>9} {theirs:>28} {case.ratio(peer).show():>17}"
            f"  {goal(case, peer)}"
        )
        if case.title.startswith("get,"):  # and the CPU per get, against the thriftiest peer
            peer = min(
                (n for n in case.samples if n != case.ours),
                key=lambda n: case.figure(n, cpu=True).median,
            )
            cpu = ratio(*([s.cpu for s in case.samples[n]] for n in (case.ours, peer)))
            ours = f"{case.figure(case.ours, cpu=True).median:.1f}"
            theirs = f"{peer} {case.figure(peer, cpu=True).median:.1f}"
            print(f"  {'CPU per get (µs)':<46} {ours:>9} {theirs:>28} {cpu.show():>17}")


def goal(case: Case, fastest: str) -> str:
    """Issue 25's goal for the case, against its named peer, with ok or MISSED."""
    if case.goal is None:
        return ""
    peer, limit = case.goal
    peer = fastest if peer == "fastest" else peer
    if peer not in case.samples:
        return f"({peer} missing)"
    r = case.ratio(peer).median
    if case.unit == "µs":
        return f"<= {limit:.2f}x {peer}: {'ok' if r <= limit else 'MISSED'} ({r:.2f})"
    return f">= {limit:.2f}x {peer}: {'ok' if r >= limit else 'MISSED'} ({r:.2f})"


if __name__ == "__main__":
    main()
