"""The ring-change drill (issue 28): a fifth server added under load, with ``migrate_from``.

Shared by the slow drill (``tests/drills/test_migration.py``, which asserts) and
``benchmarks/migrate_drill.py`` (which prints the figures).  Five memcached
servers; ``keys`` items on the first four with TTLs of 10 to 60 minutes; caches
built as the Django and Flask backends build theirs (:func:`bind_cluster`):

* the *cold baseline*: the new ring read without ``migrate_from``;
* the rollout: caches of the old configuration and of stage 1 side by side,
  then stage 1 and stage 2, then stage 2 alone, each phase a few workers
  (threads, or tasks of one event loop) reading, writing and deleting keys;
  a read that returns a key whose delete had returned before the read began
  is *stale*; the hit ratio counts reads of keys nobody deleted;
* the TTLs of the copies written back, against their originals;
* the warm-up (the copier of ``mcpatterns_warm``) in stage 1, then the new ring
  read alone;
* caches of the three configurations taking locks and adding set members side
  by side: the most holders a lock ever had at once, and the members lost.

Nothing is timed: every figure is a count or a ratio.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from django_mcpatterns.binding import ClusterBinding, Conventions, bind_cluster
from django_mcpatterns.core.cluster import Cluster, reset_shared_clusters
from django_mcpatterns.core.locks import AsyncLock, Lock
from django_mcpatterns.warming import old_ring, stage_warning, warmer
from tests.harness import MemcachedServer

DOOMED_EVERY = 20  # one key in 20 is deleted during a phase (and never written again)


@dataclass
class Phase:
    """One phase of the rollout: its reads, hits and stale reads."""

    name: str
    reads: int = 0
    hits: int = 0
    doomed_reads: int = 0
    deletes: int = 0
    stale: int = 0

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.reads if self.reads else 0.0


@dataclass
class Figures:
    """What the drill measured, for one protocol and driver."""

    protocol: str
    driver: str
    keys: int
    moved: int = 0
    cold_hit_ratio: float = 0.0
    phases: list[Phase] = field(default_factory=list)
    ttl_checked: int = 0
    ttl_max_difference: int = 0
    ttl_longest_copy: int = 0
    warm_copied: int = 0
    warm_hit_ratio: float = 0.0
    lock_acquisitions: int = 0
    most_holders: int = 0
    members_added: int = 0
    members_lost: int = 0
    copies: dict[str, int] = field(default_factory=dict)


class Drill:
    """The drill on five servers (``servers``): the first four are the old ring."""

    def __init__(
        self, servers: Sequence[MemcachedServer], protocol: str, driver: str, keys: int
    ) -> None:
        self.servers = servers
        self.specs = [server.spec for server in servers]
        self.protocol = protocol
        self.driver = driver
        self.figures = Figures(protocol, driver, keys)
        self.keys = [f"k{i}" for i in range(keys)]
        self.doomed = set(self.keys[::DOOMED_EVERY])
        self.live = [key for key in self.keys if key not in self.doomed]
        self.doomed_keys: list[str] = []
        self.sequence = itertools.count()
        self.rng = random.Random(28)
        self.tally = threading.Lock()  # the phase's counts, from several threads

    # -- configurations --------------------------------------------------------

    def binding(self, stage: str | None, ring: str = "new") -> ClusterBinding:
        """The old configuration (``stage`` None, ``ring="old"``), the new ring alone, a stage."""
        options: dict[str, Any] = {"protocol": self.protocol}
        if stage is not None:
            options["migrate_from"] = {"LOCATION": self.specs[:4], "reads": stage}
        specs = self.specs[:4] if ring == "old" else self.specs
        return bind_cluster(specs, options, Conventions())

    def fill(self) -> None:
        """Empty every server, then put the keys on the old ring with TTLs of 10 to 60 minutes."""
        for server in self.servers:
            server.flush()
        old = self.binding(None, "old").store
        rng = random.Random(7)
        by_ttl: dict[int, dict[str, Any]] = {}
        for key in self.keys:  # 50 TTLs, one set_many each
            ttl = 600 + 60 * rng.randrange(50)
            by_ttl.setdefault(ttl, {})[key] = {"key": key, "version": 0}
        for ttl, values in by_ttl.items():
            assert old.set_many(values, ttl) == []

    # -- the drill ---------------------------------------------------------------

    def run(self) -> Figures:
        figures = self.figures
        self.fill()
        new_alone = self.binding(None)
        placement = self.binding("new").values.placement  # type: ignore[attr-defined]
        figures.moved = sum(1 for key in self.keys if placement.moved(key))
        found = new_alone.store.get_many(self.live)
        figures.cold_hit_ratio = len(found) / len(self.live)
        before, first, second = self.binding(None, "old"), self.binding("old"), self.binding("new")
        self.phase("old configuration + stage 1", [before, first] * 2)
        self.phase("stage 1 + stage 2", [first, second] * 2)
        self.phase("stage 2", [second] * 4)
        figures.copies = second.migration.tally.counts()  # type: ignore[union-attr]
        self.ttls(before.store, new_alone.store)
        self.warm(first, new_alone)
        self.patterns([before, first, second])
        reset_shared_clusters()
        return figures

    def phase(self, name: str, workers: list[ClusterBinding], operations: int = 4000) -> None:
        phase = Phase(name)
        self.doomed_keys = sorted(key.rstrip("!") for key in self.doomed)
        self.figures.phases.append(phase)
        doomed = [key for key in self.doomed if not key.endswith("!")]
        self.rng.shuffle(doomed)
        share = len(doomed) // 3  # each phase deletes a third of the keys left to delete
        plan = [
            doomed[i :: len(workers)][: max(share // len(workers), 1)] for i in range(len(workers))
        ]
        deleted: dict[str, int] = {}
        seeds = [self.rng.randrange(2**32) for _ in workers]
        if self.driver == "sync":
            threads = [
                threading.Thread(target=self.worker, args=(w, p, s, operations, deleted, phase))
                for w, p, s in zip(workers, plan, seeds, strict=True)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        else:

            async def all_workers() -> None:
                await asyncio.gather(
                    *(
                        self.aworker(w, p, s, operations, deleted, phase)
                        for w, p, s in zip(workers, plan, seeds, strict=True)
                    )
                )
                for binding in workers:
                    await binding.async_values.close()

            asyncio.run(all_workers())
        self.doomed = {key if key not in deleted else key + "!" for key in self.doomed}

    def _step(
        self, rng: random.Random, to_delete: list[str], deleted: dict[str, int]
    ) -> tuple[str, str]:
        """The next operation: ("delete", key), ("write", key) or ("read", key)."""
        roll = rng.random()
        if to_delete and roll < 0.05:
            return "delete", to_delete.pop()
        if roll < 0.10:
            return "write", rng.choice(self.live)
        if roll < 0.25:
            return "read doomed", rng.choice(self.doomed_keys)
        return "read", rng.choice(self.live)

    def _judge(
        self, kind: str, key: str, started: int, value: Any, deleted: dict[str, int], phase: Phase
    ) -> None:
        gone = deleted.get(key)
        with self.tally:
            if kind == "read":
                phase.reads += 1
                phase.hits += value is not None
                return
            phase.doomed_reads += 1
            if value is not None and (
                (gone is not None and gone < started) or key + "!" in self.doomed
            ):
                phase.stale += 1

    def worker(
        self,
        binding: ClusterBinding,
        to_delete: list[str],
        seed: int,
        operations: int,
        deleted: dict[str, int],
        phase: Phase,
    ) -> None:
        values, rng = binding.values, random.Random(seed)
        for _ in range(operations):
            kind, key = self._step(rng, to_delete, deleted)
            if kind == "delete":
                values.delete(key)
                deleted[key] = next(self.sequence)
                with self.tally:
                    phase.deletes += 1
            elif kind == "write":
                values.set(key, {"key": key, "version": rng.randrange(1, 1000)}, 3600)
            else:
                started = next(self.sequence)
                self._judge(kind, key, started, values.get(key), deleted, phase)

    async def aworker(
        self,
        binding: ClusterBinding,
        to_delete: list[str],
        seed: int,
        operations: int,
        deleted: dict[str, int],
        phase: Phase,
    ) -> None:
        values, rng = binding.async_values, random.Random(seed)
        for _ in range(operations):
            kind, key = self._step(rng, to_delete, deleted)
            if kind == "delete":
                await values.delete(key)
                deleted[key] = next(self.sequence)
                phase.deletes += 1
            elif kind == "write":
                await values.set(key, {"key": key, "version": rng.randrange(1, 1000)}, 3600)
            else:
                started = next(self.sequence)
                self._judge(kind, key, started, await values.get(key), deleted, phase)

    def ttls(self, old: Cluster, new: Cluster) -> None:
        """Compare the TTLs of the copies on the new ring with their originals (meta reads)."""
        probe_old = Cluster(self.specs[:4])
        probe_new = Cluster(self.specs)
        try:
            worst = checked = longest = 0
            moved = [k for k in self.live if old.ring.get_node(k) != new.ring.get_node(k)]
            for key in moved:
                left_old, left_new = probe_old.ttl(key), probe_new.ttl(key)
                if left_old is None or left_new is None:
                    continue  # never read, or written again (its old copy deleted)
                checked += 1
                worst = max(worst, abs(left_old - left_new))
                longest = max(longest, left_new)
            self.figures.ttl_checked, self.figures.ttl_max_difference = checked, worst
            self.figures.ttl_longest_copy = longest
        finally:
            probe_old.close()
            probe_new.close()

    def warm(self, first: ClusterBinding, new_alone: ClusterBinding) -> None:
        """Fill the old ring again, warm the new one in stage 1 as ``mcpatterns_warm`` does
        (its old ring from ``migrate_from``, no rate limit), then read the new ring alone."""
        self.fill()
        assert stage_warning(first) is None  # stage 1: the stage to warm in
        stats = warmer(first, old_ring(first, None), None, None).run()
        self.figures.warm_copied = stats.copied
        found = new_alone.store.get_many(self.keys)
        self.figures.warm_hit_ratio = len(found) / len(self.keys)

    def patterns(self, configurations: list[ClusterBinding], rounds: int = 25) -> None:
        """Locks and set members from the three configurations side by side."""
        holders: dict[str, int] = {}
        added: list[tuple[str, str]] = []
        guard = threading.Lock()
        workers = configurations * 2

        def enter(name: str) -> None:
            with guard:
                holders[name] = holders.get(name, 0) + 1
                self.figures.most_holders = max(self.figures.most_holders, holders[name])
                self.figures.lock_acquisitions += 1

        def leave(name: str) -> None:
            with guard:
                holders[name] -= 1

        def work(binding: ClusterBinding, worker: int) -> None:
            for round_ in range(rounds):
                name = f"lock:{round_ % 3}"
                lock = Lock(binding.pattern_store, name, 30, blocking_timeout=30)
                with lock:
                    enter(name)
                    leave(name)
                member = f"w{worker}r{round_}"
                binding.sets.sadd(f"set:{round_ % 4}", member)
                added.append((f"set:{round_ % 4}", member))

        async def awork(binding: ClusterBinding, worker: int) -> None:
            for round_ in range(rounds):
                name = f"lock:{round_ % 3}"
                lock = AsyncLock(binding.async_pattern_store, name, 30, blocking_timeout=30)
                async with lock:
                    enter(name)
                    await asyncio.sleep(0)  # let the other tasks try meanwhile
                    leave(name)
                member = f"w{worker}r{round_}"
                await binding.async_sets.sadd(f"set:{round_ % 4}", member)
                added.append((f"set:{round_ % 4}", member))

        if self.driver == "sync":
            threads = [threading.Thread(target=work, args=(b, i)) for i, b in enumerate(workers)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        else:

            async def all_workers() -> None:
                await asyncio.gather(*(awork(b, i) for i, b in enumerate(workers)))
                for binding in configurations:
                    with contextlib.suppress(Exception):
                        await binding.async_pattern_store.close()

            asyncio.run(all_workers())
        self.figures.members_added = len(added)
        expected: dict[str, set[str]] = {}
        for name, member in added:
            expected.setdefault(name, set()).add(member)
        lost = 0
        for binding in configurations:
            for name, members in expected.items():
                lost += len(members - binding.sets.smembers(name))
        self.figures.members_lost = lost


def drill(servers: Sequence[MemcachedServer], protocol: str, driver: str, keys: int) -> Figures:
    return Drill(servers, protocol, driver, keys).run()


def report(figures: Figures) -> Iterator[str]:
    """The figures as the benchmark prints them."""
    f = figures
    yield f"protocol {f.protocol}, {f.driver}: {f.keys} keys, {f.moved} on the fifth server"
    yield f"  cold baseline (new ring, no migrate_from): hit ratio {f.cold_hit_ratio:.3f}"
    for phase in f.phases:
        yield (
            f"  {phase.name:<28} hit ratio {phase.hit_ratio:.4f} ({phase.reads} reads), "
            f"{phase.stale} stale of {phase.doomed_reads} reads of deleted keys "
            f"({phase.deletes} deletes)"
        )
    yield f"  copies: {f.copies}"
    yield (
        f"  copies' TTLs: {f.ttl_checked} checked, at most {f.ttl_max_difference} s from "
        f"the original's; the longest {f.ttl_longest_copy} s"
    )
    yield (
        f"  warm-up in stage 1: {f.warm_copied} copied; the new ring alone then: hit ratio "
        f"{f.warm_hit_ratio:.4f}"
    )
    yield (
        f"  patterns, three configurations side by side: {f.lock_acquisitions} lock "
        f"acquisitions, at most {f.most_holders} holder at once; {f.members_added} set "
        f"members added, {f.members_lost} lost"
    )
