"""Stampede protection and locks under load: get_or_compute vs Django's get_or_set.

Starts its own 3 memcached servers on loopback and 64 clients: 4 worker
processes x 16 threads (this machine has 2 cores; threads in a few processes
are real concurrent clients of memcached, each with its own think time).
Every client goes through Django's cache API:

* ``ours``: ``KetamaMemcacheCache.get_or_compute(key, compute, 1)``;
* ``django``: Django's ``PyMemcacheCache.get_or_set(key, compute, 2)`` on the
  same servers (its TTL is 2 s because memcached's whole-second clock would
  give a 1 s item anywhere between 0 and 1 s of life).

``compute`` sleeps 200 ms and records when it started.  Computations are grouped
into expiries (starts more than 0.5 s apart), and the table shows computations
per expiry, cold-miss computations, latencies (each client alternates a plain
``get`` hit with ``get_or_compute``, so both are timed under the same load) and
the requests memcached counts (``stats``) for one uncontended lock acquire +
release and for each ``get_or_compute`` path.

Targets: exactly 1 compute per expiry and per cold miss; stale-served p99
within 5x of a plain hit's p99; lock acquire + release <= 2 requests (meta
protocol: ``ms ... ME c`` returns the cas that ``md ... C<cas>`` deletes).

    python benchmarks/bench_stampede.py [--expiries 10] [--think 0.02]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROCESSES = 4
THREADS = 16
COMPUTE_SECONDS = 0.2
SOFT_TIMEOUT = 1  # ours: soft expiry (Django timeouts are whole seconds)
DJANGO_TIMEOUT = 2
EXPIRY_GAP = 0.5  # compute starts further apart than this belong to different expiries


# -- the worker process --------------------------------------------------------------


def worker(specs: list[str]) -> None:
    """Run the phases the parent sends on stdin with THREADS client threads each."""
    import django
    from django.conf import settings

    settings.configure(
        USE_TZ=True,
        INSTALLED_APPS=["django_mcpatterns"],
        CACHES={
            "ours": {"BACKEND": "django_mcpatterns.backend.KetamaMemcacheCache", "LOCATION": specs},
            "django": {
                "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
                "LOCATION": specs,
            },
        },
    )
    django.setup()
    from django.core.cache import caches

    caches["ours"].set("plain", "x" * 1000, None)  # the key of the plain-hit phase
    print("ready", flush=True)
    for line in sys.stdin:
        phase = json.loads(line)
        print(json.dumps(run_phase(caches, phase)), flush=True)


def run_phase(caches: Any, phase: dict[str, Any]) -> dict[str, Any]:
    computes: list[float] = []
    samples: dict[str, list[float]] = {}
    lock = threading.Lock()

    def compute() -> str:
        computes.append(time.time())
        time.sleep(COMPUTE_SECONDS)
        return "x" * 1000

    def plain(cache: Any) -> str:
        return "plain hit" if cache.get("plain") is not None else "plain miss"

    def ours(cache: Any) -> str:
        return cache.get_or_compute_result(phase["key"], compute, SOFT_TIMEOUT).outcome

    def theirs(cache: Any) -> str:
        cache.get_or_set(phase["key"], compute, DJANGO_TIMEOUT)
        return "get_or_set"

    # Ours alternates a plain get with get_or_compute, so both are timed under
    # the same load at the same moments (the bursts at each soft expiry included).
    steps: list[Callable[[Any], str]] = [plain, ours] if phase["mode"] == "ours" else [theirs]
    alias = phase["mode"]

    def client() -> None:
        cache = caches[alias]  # Django's per-thread backend instance
        mine: dict[str, list[float]] = {}
        time.sleep(max(0.0, phase["start_at"] - time.time()))
        end = phase["start_at"] + phase["duration"]
        while True:
            for step in steps:
                began = time.perf_counter()
                outcome = step(cache)
                mine.setdefault(outcome, []).append(time.perf_counter() - began)
            if time.time() >= end:
                break
            time.sleep(phase["think"])
        with lock:
            for outcome, latencies in mine.items():
                samples.setdefault(outcome, []).extend(latencies)

    threads = [threading.Thread(target=client) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"computes": computes, "samples": samples}


# -- the parent ----------------------------------------------------------------------


class Clients:
    """PROCESSES worker processes, driven phase by phase over stdin/stdout."""

    def __init__(self, specs: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        command = [sys.executable, __file__, "--worker", ",".join(specs)]
        self.processes = [
            subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
            )
            for _ in range(PROCESSES)
        ]
        for process in self.processes:
            assert process.stdout is not None
            assert process.stdout.readline() == "ready\n", "a worker failed to start"

    def run(self, mode: str, *, duration: float, think: float, key: str = "") -> dict[str, Any]:
        """Run one phase in every process at once; merge their computes and samples."""
        phase = {
            "mode": mode,
            "key": key,
            "duration": duration,
            "think": think,
            "start_at": time.time() + 0.3,
        }
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(json.dumps(phase) + "\n")
            process.stdin.flush()
        computes: list[float] = []
        samples: dict[str, list[float]] = {}
        for process in self.processes:
            assert process.stdout is not None
            part = json.loads(process.stdout.readline())
            computes += part["computes"]
            for outcome, latencies in part["samples"].items():
                samples.setdefault(outcome, []).extend(latencies)
        return {"computes": sorted(computes), "samples": samples}

    def close(self) -> None:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.close()
        for process in self.processes:
            process.wait(timeout=30)


def expiries(computes: list[float]) -> list[int]:
    """Computations per expiry: starts closer than EXPIRY_GAP belong to the same one."""
    groups: list[int] = []
    last = -1e18
    for started in computes:
        if started - last > EXPIRY_GAP:
            groups.append(0)
        groups[-1] += 1
        last = started
    return groups


def p(latencies: list[float], q: float) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def request_counts(servers: Any) -> dict[str, int]:
    """Requests memcached counts for a lock and for each get_or_compute path."""
    from django_mcpatterns.core.cluster import Cluster
    from django_mcpatterns.core.locks import Lock
    from django_mcpatterns.core.stampede import Stampede, lock_key
    from tests.harness import server_requests

    cluster = Cluster([s.spec for s in servers])
    stampede = Stampede(cluster)

    def count(action: Callable[[], object]) -> int:
        before = server_requests(servers)
        action()
        return server_requests(servers) - before

    lock = Lock(cluster, "bench:lock", 10)
    counts = {"lock acquire + release": count(lambda: (lock.acquire(), lock.release()))}
    counts["get_or_compute: miss (computes)"] = count(
        lambda: stampede.get_or_compute("bench:path", lambda: 1, 60)
    )
    counts["get_or_compute: fresh hit"] = count(
        lambda: stampede.get_or_compute("bench:path", lambda: 1, 60)
    )
    stampede.mark_stale("bench:path")
    cluster.add(lock_key("bench:path"), b"another winner", 10)
    counts["get_or_compute: stale, lock held elsewhere"] = count(
        lambda: stampede.get_or_compute("bench:path", lambda: 1, 60)
    )
    cluster.delete(lock_key("bench:path"))
    counts["get_or_compute: stale, this caller recomputes"] = count(
        lambda: stampede.get_or_compute("bench:path", lambda: 1, 60)
    )
    cluster.close()
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expiries", type=int, default=10)
    parser.add_argument(
        "--think", type=float, default=0.02, help="seconds between a client's calls"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker.split(","))
        return

    from tests.harness import memcached_cluster

    clients_desc = f"{PROCESSES * THREADS} clients = {PROCESSES} processes x {THREADS} threads"
    print(f"{clients_desc}, think time {args.think * 1000:.0f} ms, compute {COMPUTE_SECONDS}s")
    with memcached_cluster(3) as servers:
        counts = request_counts(servers)
        clients = Clients([s.spec for s in servers])
        try:
            # Ours: soft expiry every SOFT_TIMEOUT s; one cycle = timeout + compute.
            ours = clients.run(
                "ours",
                key="hot:ours",
                think=args.think,
                duration=0.3 + args.expiries * (SOFT_TIMEOUT + COMPUTE_SECONDS),
            )
            theirs = clients.run(
                "django",
                key="hot:django",
                think=args.think,
                duration=0.3 + args.expiries * (DJANGO_TIMEOUT + COMPUTE_SECONDS),
            )
            cold_ours = clients.run("ours", key="cold:ours", duration=0, think=0)
            cold_theirs = clients.run("django", key="cold:django", duration=0, think=0)
        finally:
            clients.close()

    failures = 0

    def verdict(ok: bool) -> str:
        nonlocal failures
        failures += not ok
        return "ok" if ok else "MISSED"

    ours_groups = expiries(ours["computes"])[1:]  # the first group is the cold start
    theirs_groups = expiries(theirs["computes"])[1:]
    print()
    print(f"{'hot key, 64 clients':<46} {'expiries':>8} {'computes/expiry':>16} {'max':>4}  target")
    print(
        f"{'get_or_compute (soft 1 s)':<46} {len(ours_groups):>8} "
        f"{statistics.mean(ours_groups):>16.2f} {max(ours_groups):>4}  "
        f"== 1 {verdict(max(ours_groups) == 1 and len(ours_groups) >= args.expiries)}"
    )
    print(
        f"{'Django get_or_set (TTL 2 s)':<46} {len(theirs_groups):>8} "
        f"{statistics.mean(theirs_groups):>16.2f} {max(theirs_groups):>4}"
    )
    print()
    cold = len(cold_ours["computes"])
    print(f"{'cold miss, 64 clients at once':<46} {'computes':>8}")
    print(f"{'get_or_compute':<46} {cold:>8}  == 1 {verdict(cold == 1)}")
    print(f"{'Django get_or_set':<46} {len(cold_theirs['computes']):>8}")
    print()
    plain, stale = ours["samples"]["plain hit"], ours["samples"].get("stale", [])
    fresh = ours["samples"].get("fresh", [])
    print(f"{'latency under load (ms)':<46} {'calls':>8} {'p50':>7} {'p99':>7}")
    for name, latencies in [
        ("plain get hit (same clients, same time)", plain),
        ("get_or_compute fresh hit", fresh),
        ("get_or_compute stale served", stale),
    ]:
        print(
            f"{name:<46} {len(latencies):>8} {p(latencies, 0.5):>7.2f} {p(latencies, 0.99):>7.2f}"
        )
    ratio = p(stale, 0.99) / p(plain, 0.99)
    ok = verdict(ratio <= 5)
    print(f"{'stale p99 / plain hit p99':<46} {'':>8} {'':>7} {ratio:>7.2f}  <= 5 {ok}")
    print()
    print(f"{'memcached requests (stats)':<46} {'count':>8}")
    for name, value in counts.items():
        target = f"  <= 2 {verdict(value <= 2)}" if name.startswith("lock") else ""
        print(f"{name:<46} {value:>8}{target}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
