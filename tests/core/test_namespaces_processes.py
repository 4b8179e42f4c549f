"""No read that starts after an invalidation has returned gets a value from before it.

One invalidator changes the "data" (a plain key, ``truth``) and then
invalidates a namespace, over and over; readers read a value of a namespace
nested in it, recomputing it from ``truth`` on a miss, with ``get_or_set``,
``get_or_compute`` and ``get``.  Every invalidation and every read is timed
with ``CLOCK_MONOTONIC`` (system-wide on Linux, so times from different
processes compare).  The check: a read that started after invalidation ``i``
returned got a value computed from ``truth >= i``.

On a 3-server cluster the invalidator and readers are separate processes that
share nothing but memcached; on the embedded store they are threads.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.namespaces import Namespaces
from django_mcpatterns.core.store import Store
from tests.conftest import flush
from tests.harness import MemcachedServer

ROOT = Path(__file__).resolve().parents[2]
READERS = 3
ROUNDS = 120
DURATION = 1.5

# Shared by the processes (exec'd) and the threads (called).
ROLES = textwrap.dedent(
    """
    import random, time

    def namespace(spaces):
        return spaces.namespace("org", 1).namespace("user", 42)

    def invalidate(store, spaces, start_at, rounds, emit):
        time.sleep(max(0.0, start_at - time.time()))
        rng = random.Random(7)
        for i in range(1, rounds + 1):
            store.set("truth", i)
            spaces.invalidate("org", 1)  # the outer level: the readers' inner one goes too
            emit(f"inv {i} {time.monotonic()}")
            time.sleep(rng.uniform(0, 0.01))

    def read(store, spaces, start_at, duration, seed, emit):
        time.sleep(max(0.0, start_at - time.time()))
        ns = namespace(spaces)
        compute = lambda: store.get("truth") or 0
        ops = ["get_or_set", "get_or_compute", "get"]
        n = seed
        # The duration, and at least 80 reads: a reader that started late (a slow import
        # on a busy machine) still reads.
        while time.time() < start_at + duration or n - seed < 80:
            op = ops[n % 3]
            n += 1
            began = time.monotonic()
            if op == "get_or_set":
                value = ns.get_or_set("value", compute)
            elif op == "get_or_compute":
                value = ns.get_or_compute("value", compute, 60)
            else:
                value = ns.get("value")
                if value is None:
                    continue
            emit(f"read {began} {value} {op}")
    """
)

PROCESS = ROLES + textwrap.dedent(
    """
    import sys
    from django_mcpatterns.core.cluster import Cluster
    from django_mcpatterns.core.namespaces import Namespaces

    role, specs, start_at = sys.argv[1], sys.argv[2].split(","), float(sys.argv[3])
    store = Cluster(specs)
    spaces = Namespaces(store)
    emit = lambda line: print(line, flush=True)
    if role == "invalidate":
        invalidate(store, spaces, start_at, int(sys.argv[4]), emit)
    else:
        read(store, spaces, start_at, float(sys.argv[4]), int(sys.argv[5]), emit)
    """
)


def check(lines: list[str]) -> tuple[int, int]:
    """Assert the guarantee over the log; return (invalidations, reads)."""
    returned: list[tuple[float, int]] = []
    reads: list[tuple[float, int, str]] = []
    for line in lines:
        kind, *fields = line.split()
        if kind == "inv":
            returned.append((float(fields[1]), int(fields[0])))
        else:
            reads.append((float(fields[0]), int(fields[1]), fields[2]))
    returned.sort()
    times = [t for t, _ in returned]
    latest = [0]
    for _, i in returned:
        latest.append(max(latest[-1], i))
    for began, value, op in reads:
        done = bisect_left(times, began)  # invalidations that returned before the read began
        assert value >= latest[done], (
            f"{op} began after invalidation {latest[done]} returned but got {value}"
        )
    return len(returned), len(reads)


@pytest.mark.slow
def test_processes_never_read_a_value_from_before_a_returned_invalidation(
    memcached_3: list[MemcachedServer],
) -> None:
    flush(memcached_3)
    specs = ",".join(s.spec for s in memcached_3)
    start_at = time.time() + 1.0  # every process imported and connected by then
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def spawn(*args: object) -> subprocess.Popen[str]:
        command = [sys.executable, "-c", PROCESS, *map(str, args)]
        return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)

    processes = [spawn("invalidate", specs, start_at, ROUNDS)]
    processes += [spawn("read", specs, start_at, DURATION, seed) for seed in range(READERS)]
    lines: list[str] = []
    for process in processes:
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0
        lines += out.splitlines()
    invalidations, reads = check(lines)
    assert invalidations == ROUNDS
    assert reads > 100


def test_threads_on_the_embedded_store_never_read_a_value_from_before_an_invalidation() -> None:
    roles: dict[str, Any] = {}
    exec(ROLES, roles)
    store: Store = MemoryStore()
    spaces = Namespaces(store)
    lines: list[str] = []
    start_at = time.time() + 0.1
    jobs: list[Callable[[], object]] = [
        lambda: roles["invalidate"](store, spaces, start_at, ROUNDS // 2, lines.append)
    ]
    for seed in range(READERS):
        jobs.append(
            lambda seed=seed: roles["read"](store, spaces, start_at, 0.5, seed, lines.append)
        )
    threads = [threading.Thread(target=job) for job in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    invalidations, reads = check(lines)
    assert invalidations == ROUNDS // 2
    assert reads > 100


def test_the_check_catches_a_stale_read() -> None:
    assert check(["inv 1 10.0", "read 9.0 0 get"]) == (1, 1)  # began before: fine
    with pytest.raises(AssertionError, match="began after invalidation 1"):
        check(["inv 1 10.0", "read 10.5 0 get"])
