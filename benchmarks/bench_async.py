"""asyncio side by side: AsyncCluster vs Django's async API on PyLibMCCache, PyMemcacheCache.

Starts three memcached servers on loopback (``-t 1``: one worker thread each, so
every client's connections are served alike), then runs one workload through
every contender in one process, interleaved round by round, and prints the
median time per round and the ratios (lower is better):

* 50 concurrent tasks, each doing ``--ops`` times: ``aget`` of its own key,
  ``aset`` of it, ``aget_many`` of 10 keys (its own and its neighbours');
* **ours**: :class:`~django_mcpatterns.core.aio.AsyncCluster` directly (the
  Django backend's ``a*`` methods are its one-line callers once the glue lands);
* **PyLibMCCache** / **PyMemcacheCache**: Django's async API on them, which is
  Django's default: every call is ``sync_to_async`` (one thread hop), and
  ``aget_many`` loops over ``aget``;
* **ours sync, one thread**: the same operations one after another through
  :class:`~django_mcpatterns.core.cluster.Cluster`, as operations per second.

It also counts the thread hops (``SyncToAsync`` calls) of one round of each.

    python benchmarks/bench_async.py [--rounds 7] [--ops 20] [--tasks 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import django
from asgiref.sync import SyncToAsync
from django.conf import settings

settings.configure(USE_TZ=True)
django.setup()

from django.core.cache.backends.memcached import PyLibMCCache, PyMemcacheCache  # noqa: E402

from django_mcpatterns.core.aio import AsyncCluster  # noqa: E402
from django_mcpatterns.core.cluster import Cluster  # noqa: E402
from tests.harness import memcached_cluster  # noqa: E402

VALUE = "v" * 100
MANY = 10  # keys per aget_many

# The targets (issue 14): ours at most this times PyLibMCCache's time; at least this
# times the operations per second of our sync API in one thread.
TARGET_VS_PYLIBMC = 0.33
TARGET_VS_SYNC = 2.0


class Ops:
    """The three operations of the workload, as one contender spells them."""

    def __init__(
        self,
        get: Callable[[str], Awaitable[Any]],
        set_: Callable[[str, Any], Awaitable[Any]],
        get_many: Callable[[list[str]], Awaitable[Any]],
    ) -> None:
        self.get, self.set, self.get_many = get, set_, get_many


def django_ops(cache: Any) -> Ops:
    return Ops(cache.aget, lambda k, v: cache.aset(k, v, 300), cache.aget_many)


def our_ops(cluster: AsyncCluster) -> Ops:
    return Ops(cluster.get, lambda k, v: cluster.set(k, v, 300), cluster.get_many)


def keys_of(task: int, tasks: int) -> tuple[str, list[str]]:
    own = f"bench:async:{task}"
    return own, [f"bench:async:{(task + j) % tasks}" for j in range(MANY)]


async def concurrent_round(ops: Ops, tasks: int, rounds_of_ops: int) -> float:
    """Seconds for ``tasks`` concurrent tasks doing the workload."""

    async def task(n: int) -> None:
        own, many = keys_of(n, tasks)
        for _ in range(rounds_of_ops):
            await ops.get(own)
            await ops.set(own, VALUE)
            await ops.get_many(many)

    start = time.perf_counter()
    await asyncio.gather(*[task(n) for n in range(tasks)])
    return time.perf_counter() - start


def sync_round(cluster: Cluster, tasks: int, rounds_of_ops: int) -> float:
    """Seconds for the same operations one after another, in one thread."""
    start = time.perf_counter()
    for n in range(tasks):
        own, many = keys_of(n, tasks)
        for _ in range(rounds_of_ops):
            cluster.get(own)
            cluster.set(own, VALUE, 300)
            cluster.get_many(many)
    return time.perf_counter() - start


def count_hops(loop: asyncio.AbstractEventLoop, ops: Ops, tasks: int, n: int) -> int:
    """Thread hops (``SyncToAsync`` calls) in one round."""
    hops = 0
    original = SyncToAsync.__call__

    async def counting(self: SyncToAsync[Any, Any], *args: Any, **kwargs: Any) -> Any:
        nonlocal hops
        hops += 1
        return await original(self, *args, **kwargs)

    with mock.patch.object(SyncToAsync, "__call__", counting):
        loop.run_until_complete(concurrent_round(ops, tasks, n))
    return hops


def has_pylibmc() -> bool:
    try:
        import pylibmc  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", type=int, default=20, help="workload repetitions per task")
    parser.add_argument("--tasks", type=int, default=50)
    args = parser.parse_args()
    operations = args.tasks * args.ops * 3

    with memcached_cluster(3, extra_args=("-t", "1")) as servers:
        location = [s.spec for s in servers]
        sync = Cluster(location)
        contenders: dict[str, Ops] = {"ours": our_ops(sync.aio)}
        if has_pylibmc():
            # As in bench_django: Django's pylibmc defaults, ketama distribution as ours.
            pylibmc_cache = PyLibMCCache(
                location, {"OPTIONS": {"binary": False, "behaviors": {"ketama_weighted": True}}}
            )
            contenders["PyLibMCCache"] = django_ops(pylibmc_cache)
        contenders["PyMemcacheCache"] = django_ops(PyMemcacheCache(location, {}))

        loop = asyncio.new_event_loop()
        for ops in contenders.values():  # connections open, keys present
            loop.run_until_complete(concurrent_round(ops, args.tasks, 1))
        sync_round(sync, args.tasks, 1)

        samples: dict[str, list[float]] = {name: [] for name in [*contenders, "ours sync"]}
        for _ in range(args.rounds):
            for name, ops in contenders.items():
                samples[name].append(
                    loop.run_until_complete(concurrent_round(ops, args.tasks, args.ops))
                )
            samples["ours sync"].append(sync_round(sync, args.tasks, args.ops))
        hops = {
            name: count_hops(loop, ops, args.tasks, args.ops) for name, ops in contenders.items()
        }
        loop.run_until_complete(sync.aio.close())
        loop.close()
        sync.close()

    median = {name: statistics.median(values) for name, values in samples.items()}
    ours = median["ours"]
    print(
        f"{args.tasks} concurrent tasks x {args.ops} x (aget, aset, aget_many({MANY})) "
        f"on 3 servers: {operations} operations a round, median of {args.rounds} rounds"
    )
    print(f"{'contender':<28} {'ms/round':>9} {'ops/s':>9} {'ours/them':>10} {'thread hops':>12}")
    for name, seconds in median.items():
        label = name if name != "ours sync" else "ours sync API, one thread"
        if name == "ours":
            label = "ours (AsyncCluster)"
        elif name != "ours sync":
            label = f"{name} async API"
        hop = str(hops[name]) if name in hops else "-"
        print(
            f"{label:<28} {seconds * 1e3:>9.1f} {operations / seconds:>9.0f} "
            f"{ours / seconds:>10.2f} {hop:>12}"
        )
    if "PyLibMCCache" in median:
        ratio = ours / median["PyLibMCCache"]
        verdict = "ok" if ratio <= TARGET_VS_PYLIBMC else "MISSED"
        print(f"target: ours <= {TARGET_VS_PYLIBMC}x PyLibMCCache's time: {ratio:.2f}x {verdict}")
    speedup = median["ours sync"] / ours
    verdict = "ok" if speedup >= TARGET_VS_SYNC else "MISSED"
    print(f"target: ours >= {TARGET_VS_SYNC}x the ops/s of our sync API: {speedup:.2f}x {verdict}")


if __name__ == "__main__":
    main()
