"""How soon a stalled or restarted server serves again, with default options, under load.

The figures docs/failures.md quotes ("How a cluster sees a failing server").  Each
run starts 4 memcached servers on loopback and a ``Cluster`` with default
options, and keeps 8 threads setting and getting keys of every server; then

- *stall*: one server is stopped (SIGSTOP) for ``--stall`` seconds and resumed:
  seconds from SIGCONT until a key of that server is written and read back;
- *restart*: one server is killed (SIGKILL) and started again, empty, on the same
  port after each of ``--downtimes`` seconds: seconds from the kill to its first
  failure and to ``dead``, and from the restart until a key of it is written and
  read back.

A restarted server is found by the next probe of its back-off (about 1, 2, 4, 8,
16, then every 30 s after the kill, each shortened by up to a quarter at random),
so the restart figure depends on where the restart falls between two probes: it
ranges from almost nothing to the wait in progress.  Prints every run, then the
range and median per case.  The tests check the behaviour on a fake clock
(tests/drills/test_health_recovery.py); this script times it in real time.

    python benchmarks/bench_recovery.py [--runs 5] [--downtimes 2,5,10] [--stall 1.5]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import random
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.health import NodeEvent
from django_mcpatterns.core.options import ClusterOptions
from tests.harness import MemcachedServer, memcached_cluster

THREADS = 8
SERVERS = 4
LIMIT = 60.0  # seconds to wait for a server to serve again (dead_timeout is 30 s)


class Events:
    """The cluster's node events with the time each was reported."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def __call__(self, event: NodeEvent) -> None:
        with self._lock:
            self.seen.append((time.monotonic(), event.kind))

    def after(self, kind: str, since: float) -> float:
        """Seconds from ``since`` to the first ``kind`` event after it (inf: none)."""
        with self._lock:
            times = [t for t, k in self.seen if k == kind and t >= since]
        return times[0] - since if times else float("inf")


@contextmanager
def load(cluster: Cluster) -> Iterator[list[BaseException]]:
    """``THREADS`` threads setting and getting keys of every server until the block ends."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        keys = [f"load:{seed}:{i}" for i in range(64)]
        while not stop.is_set():
            key = rng.choice(keys)
            try:
                if rng.random() < 0.5:
                    cluster.set(key, seed)
                else:
                    cluster.get(key)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    try:
        yield errors
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)


def served_after(cluster: Cluster, node: str, since: float) -> float:
    """Seconds from ``since`` until a key of ``node`` is written and read back (inf: never)."""
    key = next(
        k for k in (f"probe:{i}" for i in itertools.count()) if cluster.ring.get_node(k) == node
    )
    while time.monotonic() - since < LIMIT:
        if cluster.set(key, "back") and cluster.get(key) == "back":
            return time.monotonic() - since
        time.sleep(0.01)
    return float("inf")


def stall_run(servers: list[MemcachedServer], stall: float) -> dict[str, float]:
    events, victim = Events(), servers[1]
    cluster = Cluster([s.spec for s in servers], ClusterOptions(), on_node_event=events)
    with load(cluster) as errors:
        time.sleep(0.5)
        victim.pause()
        try:
            time.sleep(stall)
        finally:
            victim.resume()
        resumed = time.monotonic()
        back = served_after(cluster, victim.spec, resumed)
    failures = sum(1 for _, kind in events.seen if kind == "failure")
    cluster.close()
    return {"served again": back, "failures": failures, "errors": len(errors)}


def restart_run(servers: list[MemcachedServer], downtime: float) -> dict[str, float]:
    events, victim = Events(), servers[2]
    cluster = Cluster([s.spec for s in servers], ClusterOptions(), on_node_event=events)
    with load(cluster) as errors:
        time.sleep(0.5)
        killed = time.monotonic()
        victim.kill()
        time.sleep(downtime)
        victim.start()  # same port, empty; returns once it accepts connections
        restarted = time.monotonic()
        back = served_after(cluster, victim.spec, restarted)
    figures = {
        "first failure": events.after("failure", killed),
        "dead": events.after("dead", killed),
        "served again": back,
        "errors": len(errors),
    }
    cluster.close()
    return figures


def summary(values: list[float]) -> str:
    return (
        f"{min(values):.2f}-{max(values):.2f} s (median {statistics.median(values):.2f} s, "
        f"{len(values)} runs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each case")
    parser.add_argument("--downtimes", default="2,5,10", help="seconds between kill and restart")
    parser.add_argument("--stall", type=float, default=1.5, help="seconds stopped (0: skip)")
    args = parser.parse_args()
    downtimes = [float(d) for d in args.downtimes.split(",") if d]
    logging.getLogger("django_mcpatterns").setLevel(logging.ERROR)  # "dead", "back": expected

    print(f"{SERVERS} memcached servers on loopback, {THREADS} threads of load, default options")
    results: dict[str, list[float]] = {}
    for run in range(args.runs):
        if args.stall:
            with memcached_cluster(SERVERS) as servers:
                figures = stall_run(servers, args.stall)
            print(
                f"run {run + 1}: SIGSTOP {args.stall:g} s: served again "
                f"{figures['served again']:.2f} s after SIGCONT; "
                f"{figures['failures']:g} failure(s) counted; {figures['errors']:g} errors"
            )
            results.setdefault(f"SIGSTOP {args.stall:g} s: served again after SIGCONT", []).append(
                figures["served again"]
            )
        for downtime in downtimes:
            with memcached_cluster(SERVERS) as servers:
                figures = restart_run(servers, downtime)
            print(
                f"run {run + 1}: SIGKILL, restart after {downtime:g} s: first failure "
                f"{figures['first failure']:.3f} s and dead {figures['dead']:.2f} s after the "
                f"kill; served again {figures['served again']:.2f} s after the restart; "
                f"{figures['errors']:g} errors"
            )
            case = f"SIGKILL, restarted after {downtime:g} s: served again after the restart"
            results.setdefault(case, []).append(figures["served again"])
            results.setdefault("SIGKILL: dead after the kill", []).append(figures["dead"])
    print()
    for case, values in results.items():
        print(f"{case}: {summary(values)}")


if __name__ == "__main__":
    main()
