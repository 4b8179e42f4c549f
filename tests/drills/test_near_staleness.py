"""The near cache's bound, across processes, on the real clock: no read older than it allows.

A writer process updates hot keys through memcached and stamps each write's
completion on the machine's monotonic clock (shared by every process) after
its reply came.  Reader processes, each with several threads, read the same
keys through a near cache (``max_age`` :data:`MAX_AGE`), reading the clock
before each lookup; one read in four is of a cold key (never written: a miss),
and those misses carry the hot keys due for a refresh ahead.  Afterwards every
read of a hot key is checked against the writes:

    no read returns a value older than the newest write that completed more
    than ``max_age`` before the read began.

The test asserts on that ordering (0 violations), never on a duration: a slow
machine delays reads and writes alike, and the bound holds whatever the delays.
"""

from __future__ import annotations

import bisect
import multiprocessing
import pickle
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests import forked
from tests.harness import MemcachedServer

pytestmark = pytest.mark.slow

MAX_AGE = 0.05
KEYS = [f"hot:{i}" for i in range(8)]
COLD = [f"cold:{i}" for i in range(100_000)]  # read now and then: misses that carry refreshes
WRITES = 1500
READERS = 3  # processes
THREADS = 4  # per reader


def writer(spec: str, started: Any, done: Any, out: str) -> None:
    """Update the keys in turn; stamp each write's completion after its reply."""
    forked.dump_stacks_on_signal()
    from django_mcpatterns.core.cluster import Cluster

    cluster = Cluster([spec])
    rng = random.Random(1)
    completed: list[tuple[str, int, float]] = []
    started.wait()  # every reader is reading
    for version in range(1, WRITES + 1):
        key = rng.choice(KEYS)
        assert cluster.set(key, version)
        completed.append((key, version, time.monotonic()))  # after the reply
        if version % 10 == 0:
            time.sleep(0.001)  # let reads in between: some of each key's copies age out
    done.set()
    Path(out).write_bytes(pickle.dumps(completed))


def reader(spec: str, started: Any, done: Any, out: str, seed: int) -> None:
    """Read the keys through a near cache from several threads until the writer is done."""
    forked.dump_stacks_on_signal()
    from django_mcpatterns.core.cluster import Cluster
    from django_mcpatterns.core.near import NearOptions, NearStore, NearTable

    table = NearTable(NearOptions(MAX_AGE))  # the real, monotonic clock
    near = NearStore(Cluster([spec]), table)
    reads: list[list[tuple[str, int, float]]] = [[] for _ in range(THREADS)]

    def run(log: list[tuple[str, int, float]], rng: random.Random) -> None:
        while not done.is_set():
            if rng.random() < 0.25:
                near.get(rng.choice(COLD))  # a miss: the hot keys due go along
                continue
            key = rng.choice(KEYS)
            began = time.monotonic()  # before the lookup
            log.append((key, near.get(key), began))

    threads = [
        threading.Thread(target=run, args=(reads[t], random.Random(seed * 100 + t)))
        for t in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    started.wait()  # the writer starts once every reader reads
    for thread in threads:
        thread.join()
    stats = table.stats()
    found = [r for log in reads for r in log]
    from django_mcpatterns.core.protocol import compiled

    # Whether the compiled exchange looked first (its reads mostly near hits): the bound
    # must hold on that path too.
    looked = compiled.speedups.look_first() if compiled.speedups is not None else None
    Path(out).write_bytes(pickle.dumps((found, stats.hits, stats.refreshed, looked)))


def test_no_read_is_older_than_the_bound_allows(
    memcached_1: list[MemcachedServer], tmp_path: Path
) -> None:
    from django_mcpatterns.core.cluster import Cluster

    spec = memcached_1[0].spec
    seed = Cluster([spec])
    seed.set_many(dict.fromkeys(KEYS, 0))  # version 0, before anyone starts
    seed.close()
    context = multiprocessing.get_context("spawn")
    started, done = context.Barrier(READERS + 1, timeout=120), context.Event()
    written = tmp_path / "writes"
    processes = [context.Process(target=writer, args=(spec, started, done, str(written)))]
    logs = [tmp_path / f"reads{i}" for i in range(READERS)]
    processes += [
        context.Process(target=reader, args=(spec, started, done, str(log), i))
        for i, log in enumerate(logs)
    ]
    for process in processes:
        process.start()
    for process in processes:
        forked.join(process, 300)
        assert process.exitcode == 0

    completed: dict[str, tuple[list[float], list[int]]] = {key: ([], []) for key in KEYS}
    for key, version, at in pickle.loads(written.read_bytes()):
        completed[key][0].append(at)
        completed[key][1].append(version)
    reads, hits, refreshed, violations, behind, looked = 0, 0, 0, [], 0, []
    for log in logs:
        found, held, renewed, looking = pickle.loads(log.read_bytes())
        hits += held
        refreshed += renewed
        looked.append(looking)
        for key, version, began in found:
            reads += 1
            times, versions = completed[key]
            # The newest write that completed more than max_age before the read began.
            settled = bisect.bisect_left(times, began - MAX_AGE)
            floor = versions[settled - 1] if settled else 0
            if version < floor:
                violations.append((key, version, floor, began))
            newest = bisect.bisect_left(times, began)
            if newest and version < versions[newest - 1]:
                behind += 1  # older than a completed write, within the bound: allowed
    print(
        f"near drill: {reads} reads by {READERS}x{THREADS} threads, {hits} near hits, "
        f"{refreshed} refreshed ahead, "
        f"{behind} within the bound behind the newest write, {len(violations)} violations; "
        f"readers looking first at the end: {looked}"
    )
    assert violations == []
    assert None in looked or all(looked)  # compiled: each reader's exchange kept the GIL
    assert 0 < hits < reads  # held near, and aged out: read again
    assert refreshed > 0  # hot keys renewed by the cold misses' requests
    assert reads > WRITES
