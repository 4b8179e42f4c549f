"""Exact cached counters with real processes, real memcached and SQLite (WAL) as the truth.

Writers insert and delete rows under ``counter.change`` (some roll back),
readers reload through the loader whenever they miss, and an evictor deletes
the counter's items (the count and its flight record) at random moments.
Once the writers are done the counter must equal ``SELECT COUNT(*)``, in
every run.
"""

from __future__ import annotations

import gc
import multiprocessing
import random
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from django_mcpatterns.core.cached_counters import CachedCounter
from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.keys import Routed
from django_mcpatterns.core.options import ClusterOptions
from tests import forked
from tests.harness import MemcachedServer

pytestmark = pytest.mark.slow  # processes of their own: a drill

RUNS = 6
APPLY_DELAY = 0.004  # seconds a writer may wait between its commit and its apply
WRITERS, READERS, WRITES = 3, 2, 40


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 30000")
    return conn


def _counter(spec: str, protocol: str, key: str, path: str) -> tuple[CachedCounter, Cluster]:
    cluster = Cluster([spec], ClusterOptions(protocol=protocol))  # type: ignore[arg-type]
    conn = _connect(path)

    def load() -> int:
        (count,) = conn.execute("SELECT COUNT(*) FROM rows").fetchone()
        time.sleep(random.random() / 500)  # widen the window between load and fill
        return int(count)

    return CachedCounter(cluster, key, load), cluster


def _writer(spec: str, protocol: str, key: str, path: str, seed: int) -> None:
    forked.dump_stacks_on_signal()
    rng = random.Random(seed)
    counter, cluster = _counter(spec, protocol, key, path)
    conn = _connect(path)
    mine: list[int] = []
    for _ in range(WRITES):
        insert = not mine or rng.random() < 0.6
        rollback = rng.random() < 0.1
        try:
            with counter.change(+1 if insert else -1):
                conn.execute("BEGIN IMMEDIATE")
                if insert:
                    row = conn.execute("INSERT INTO rows (writer) VALUES (?)", (seed,)).lastrowid
                else:
                    row = mine.pop(rng.randrange(len(mine)))
                    conn.execute("DELETE FROM rows WHERE id = ?", (row,))
                time.sleep(rng.random() / 1000)
                if rollback:
                    raise RuntimeError("rolled back")
                conn.execute("COMMIT")
                time.sleep(rng.random() * APPLY_DELAY)  # committed, not yet applied to the cache
                if insert:
                    assert row is not None
                    mine.append(row)
            time.sleep(rng.random() / 1000)  # the change applied: readers may refill now
        except RuntimeError:
            conn.execute("ROLLBACK")
            if not insert:
                mine.append(row)
    conn.close()
    cluster.close()


def _reader(spec: str, protocol: str, key: str, path: str, done: Any, loads: Any) -> None:
    forked.dump_stacks_on_signal()
    counter, cluster = _counter(spec, protocol, key, path)
    while not done.is_set():
        counter.get()
    cluster.close()


def _evictor(spec: str, key: str, done: Any, seed: int, evictions: Any) -> None:
    forked.dump_stacks_on_signal()
    rng = random.Random(seed)
    cluster = Cluster([spec])
    raw = key.encode()
    while not done.is_set():
        time.sleep(rng.random() / 200)
        target = key if rng.random() < 0.5 else Routed(raw + b":f", raw)
        if cluster.delete(target):
            with evictions.get_lock():
                evictions.value += 1
    cluster.close()


def _run(spec: str, protocol: str, tmp: Path, seed: int) -> tuple[int, int, int]:
    path = str(tmp / f"truth-{seed}.sqlite3")
    conn = _connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, writer INTEGER)")
    conn.close()  # SQLite: never carry an open connection across fork()
    key = f"count-{uuid.uuid4().hex[:12]}"
    ctx = multiprocessing.get_context("fork")
    done, evictions, loads = ctx.Event(), ctx.Value("i", 0), ctx.Value("i", 0)
    writers = [
        ctx.Process(target=_writer, args=(spec, protocol, key, path, seed * 10 + i))
        for i in range(WRITERS)
    ]
    others = [
        ctx.Process(target=_reader, args=(spec, protocol, key, path, done, loads))
        for _ in range(READERS)
    ]
    others.append(ctx.Process(target=_evictor, args=(spec, key, done, seed, evictions)))
    # A child must not finalize this worker's garbage (objects of earlier tests): a finalizer
    # run there may wait for a lock another thread held at fork() (a CI run's reader hung in
    # the collector).  Collected here, the rest frozen while the children are made.
    gc.collect()
    gc.freeze()
    try:
        for process in writers + others:
            process.start()
    finally:
        gc.unfreeze()
    for process in writers:
        forked.join(process, 120)
        assert process.exitcode == 0
    done.set()
    for process in others:
        forked.join(process, 30)
        assert process.exitcode == 0
    conn = _connect(path)
    (truth,) = conn.execute("SELECT COUNT(*) FROM rows").fetchone()
    conn.close()
    counter, cluster = _counter(spec, protocol, key, path)
    cached = counter.get()
    again = cluster.get(key)  # what memcached holds now (None: evicted at the very end)
    cluster.close()
    return truth, cached, evictions.value if again is None else int(again) - truth + evictions.value


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_counter_equals_the_truth_after_racing_processes(
    protocol: str, memcached_1: list[MemcachedServer], tmp_path: Path
) -> None:
    evicted = 0
    for run in range(RUNS):
        truth, cached, evictions = _run(memcached_1[0].spec, protocol, tmp_path, run + 1)
        assert cached == truth, f"run {run}: counter {cached}, truth {truth}"
        evicted += evictions
    assert evicted > RUNS  # the evictor did delete items during the runs
