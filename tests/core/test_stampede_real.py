"""get_or_compute on real memcached: request counts per path, and real processes.

The algorithm is proven step by step on a fake clock in ``patterns/_async/test_stampede.py``;
here a 3-server cluster shows what the servers see (requests per path, the
envelope read by a plain client, the TTL memcached holds), and one smoke test
runs 16 callers in 4 processes through a cold miss and a soft expiry.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.envelope import with_envelopes
from django_mcpatterns.core.memory import MemoryStore
from django_mcpatterns.core.namespaces import Namespaces
from django_mcpatterns.core.options import ClusterOptions
from django_mcpatterns.core.serializers import ValueSerde
from django_mcpatterns.core.stampede import Stampede, StampedePolicy, lock_key
from django_mcpatterns.core.store import Store
from django_mcpatterns.core.wire import MetaGet
from tests.conftest import flush
from tests.fakes import FakeClock
from tests.harness import MemcachedServer, cluster_on, server_requests, server_ttl

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(memcached_3: list[MemcachedServer]) -> Iterator[Cluster]:
    with cluster_on(memcached_3) as cluster:
        yield cluster


@pytest.mark.parametrize("protocol", ["meta", "text"])
def test_requests_per_path(memcached_3: list[MemcachedServer], protocol: str) -> None:
    flush(memcached_3)
    options = ClusterOptions(protocol=protocol)  # type: ignore[arg-type]
    cluster = Cluster([s.spec for s in memcached_3], options)
    stampede = Stampede(cluster, StampedePolicy(grace=5))  # hard expiry far away

    def count(timeout: float, compute: object = lambda: "v") -> tuple[str, int]:
        before = server_requests(memcached_3)
        outcome = stampede.fetch("req:key", compute, timeout).outcome  # type: ignore[arg-type]
        return outcome, server_requests(memcached_3) - before

    if protocol == "meta":
        # Cold: mg + ms ME (the placeholder's add, won), ms C<cas> (the fill).
        assert count(1) == ("computed", 3)
        assert count(1) == ("fresh", 2)  # mg + the add, refused: one round trip
        stampede.mark_stale("req:key")
        replies = cluster.exchange("req:key", [MetaGet(b"req:key", recache=5)])
        assert replies is not None
        assert replies[0].won  # another client recomputes
        assert count(1) == ("stale", 2)  # Z: the stale value at once
        stampede.mark_stale("req:key")
        assert count(1) == ("computed", 3)  # W: mg + the add, then the fill
        cluster.close()
        return
    # Cold: get, add (lock), add (lease placeholder), gets (its cas), cas (the fill),
    # gets + cas (release).
    assert count(1) == ("computed", 7)
    assert count(1) == ("fresh", 1)
    time.sleep(1.1)  # soft-expired (soft expiries are exact), well within grace
    cluster.add(lock_key("req:key"), b"someone else", 10)
    assert count(1) == ("stale", 2)  # get, add refused: the stale value at once
    cluster.delete(lock_key("req:key"))
    # Stale: get, add (lock), gets (re-check and lease), cas (the fill), gets + cas (release).
    assert count(1) == ("computed", 6)
    cluster.close()


def test_a_plain_client_reads_the_value_and_memcached_holds_soft_plus_grace(
    cluster: Cluster, memcached_3: list[MemcachedServer]
) -> None:
    Stampede(cluster, StampedePolicy(grace=100)).get_or_compute("ttl:key", lambda: "v", 50)
    assert cluster.get("ttl:key") == "v"
    ttls = [ttl for ttl in (server_ttl(s, "ttl:key") for s in memcached_3) if ttl is not None]
    assert len(ttls) == 1
    assert 150 <= ttls[0] <= 151  # ceil(50 + 100) + 1: at least soft TTL + grace


# 4 threads per process, released together at each start time read from stdin.
CALLERS = textwrap.dedent(
    """
    import json, sys, threading, time
    from django_mcpatterns.core.cluster import Cluster
    from django_mcpatterns.core.stampede import Stampede, StampedePolicy

    cluster = Cluster(sys.argv[1].split(","))
    stampede = Stampede(cluster, StampedePolicy(grace=3))
    cluster.get("warm-up")  # connected before the clock starts
    print("ready", flush=True)

    def compute():
        time.sleep(COMPUTE)
        cluster.incr("computes", 1)
        return "value"

    def caller(start_at, results):
        time.sleep(max(0.0, start_at - time.time()))
        began = time.monotonic()
        outcome = stampede.fetch("hot", compute, 1).outcome
        results.append([outcome, time.monotonic() - began])

    for line in sys.stdin:
        results = []
        threads = [
            threading.Thread(target=caller, args=(float(line), results)) for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print(json.dumps(results), flush=True)
    """
).replace("COMPUTE", "0.6")


class Callers:
    """Four processes of four caller threads, run phase by phase."""

    def __init__(self, specs: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.processes = [
            subprocess.Popen(
                [sys.executable, "-c", CALLERS, specs],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                cwd=ROOT,
            )
            for _ in range(4)
        ]
        for process in self.processes:
            assert process.stdout is not None
            assert process.stdout.readline() == "ready\n"

    def run(self, start_at: float) -> list[tuple[str, float]]:
        """Release all 16 callers at ``start_at``; return their (outcome, seconds)."""
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(f"{start_at}\n")
            process.stdin.flush()
        results = []
        for process in self.processes:
            assert process.stdout is not None
            results += [tuple(r) for r in json.loads(process.stdout.readline())]
        return results

    def close(self) -> None:
        for process in self.processes:
            assert process.stdin is not None
            assert process.stdout is not None
            process.stdin.close()
            assert process.wait(timeout=30) == 0
            process.stdout.close()


@pytest.mark.slow
def test_sixteen_callers_in_four_processes_compute_once_per_miss_and_per_expiry(
    cluster: Cluster, memcached_3: list[MemcachedServer]
) -> None:
    cluster.set("computes", b"0")
    callers = Callers(",".join(s.spec for s in memcached_3))
    try:
        cold = callers.run(time.time() + 0.2)
        assert int(cluster.get("computes")) == 1
        # Release them again once the value is stale (its hard expiry is 3 s later) and
        # memcached hands out its recompute token: within a second of the soft expiry (its
        # clock ticks in whole seconds; callers before that are served the stale value).
        soft_expiry = Stampede(cluster).read("hot").soft_expiry
        stale = callers.run(soft_expiry + 1.1)
        assert int(cluster.get("computes")) == 2
        # Marked stale (meta: md I): memcached hands W to one caller of the sixteen.
        assert Stampede(cluster).mark_stale("hot")
        marked = callers.run(time.time() + 0.2)
        assert int(cluster.get("computes")) == 3
    finally:
        callers.close()
    cold_outcomes = Counter(outcome for outcome, _ in cold)
    stale_outcomes = Counter(outcome for outcome, _ in stale)
    # One computes; the others waited for it (or, descheduled past it, found it fresh).
    assert cold_outcomes["computed"] == 1
    assert cold_outcomes["waited"] + cold_outcomes["fresh"] == 15
    assert stale_outcomes["computed"] == 1
    assert stale_outcomes["stale"] + stale_outcomes["fresh"] == 15
    assert stale_outcomes["stale"] >= 8
    marked_outcomes = Counter(outcome for outcome, _ in marked)
    assert marked_outcomes["computed"] == 1
    assert marked_outcomes["stale"] + marked_outcomes["fresh"] == 15


# -- plain reads honour the soft expiry (issue 12, point 5) ------------------------------


@pytest.fixture(params=["embedded", "cluster"])
def timed_store(
    request: pytest.FixtureRequest, memcached_3: list[MemcachedServer]
) -> Iterator[tuple[Store, FakeClock, ValueSerde]]:
    """A store whose envelope serde reads the test's clock, and that serde's inner one."""
    clock = FakeClock(time.time())  # the cluster's items live by memcached's own clock
    inner = ValueSerde()
    if request.param == "embedded":
        yield MemoryStore(serde=inner, clock=clock), clock, inner
        return
    flush(memcached_3)
    cluster = Cluster([s.spec for s in memcached_3], serde=with_envelopes(inner, clock=clock))
    yield cluster, clock, inner
    cluster.close()


def test_plain_reads_miss_after_the_timeout_while_get_or_compute_serves_it_stale(
    timed_store: tuple[Store, FakeClock, ValueSerde],
) -> None:
    # Until now plain reads returned the value until soft + grace (the hard TTL).
    store, clock, inner = timed_store
    stampede = Stampede(store, StampedePolicy(grace=60), clock=clock, sleep=clock.sleep)
    spaces = Namespaces(store, clock=clock, stampede=lambda view: Stampede(view, clock=clock))
    ns = spaces.namespace("user", 1)
    # A timeout of 5 s on the test's clock, and memcached's barely moved: the caller that
    # finds the value stale takes the lock (memcached would hand its token 5 s from now).
    assert stampede.get_or_compute("plain:k", lambda: "old", 5) == "old"
    assert ns.get_or_compute("k", lambda: "old", 5, policy=StampedePolicy(grace=60)) == "old"
    clock.advance(4.9)
    assert store.get("plain:k") == "old"
    assert store.get_many(["plain:k"]) == {"plain:k": "old"}
    assert ns.get("k") == "old"
    clock.advance(0.2)  # past the timeout, well within the grace period
    assert store.get("plain:k") is None
    assert store.get("plain:k", "default") == "default"
    assert store.get_many(["plain:k", "other"]) == {}
    assert store.gets("plain:k") == (None, None)
    assert store.gets_many(["plain:k"]) == {}
    assert ns.get("k") is None
    assert ns.get_many(["k"]) == {}
    # The item stays for get_or_compute: one caller recomputes, the others get it stale.
    for read, key in ((stampede, "plain:k"), (ns, "k")):
        served: list[str] = []

        def recompute(read: Any = read, key: str = key, served: list[str] = served) -> str:
            served.append(read.get_or_compute(key, lambda: "never", 5))
            return "new"

        assert read.get_or_compute(key, recompute, 5) == "new"
        assert served == ["old"]
    assert store.get("plain:k") == "new"
    assert ns.get("k") == "new"
    assert inner.refusals() == {}  # a stale value is a plain miss, not a refused one


def test_mark_stale_over_meta_hands_one_win_token_and_plain_reads_miss(
    cluster: Cluster,
) -> None:
    stampede = Stampede(cluster, StampedePolicy(grace=60))
    stampede.get_or_compute("ms:key", lambda: "old", 60)
    assert stampede.mark_stale("ms:key")
    assert cluster.get("ms:key") is None  # plain reads: a miss, as after the timeout
    first, second = (cluster.exchange("ms:key", [MetaGet(b"ms:key", value=True)]) for _ in "ab")
    assert first is not None
    assert second is not None
    assert (first[0].stale, first[0].won, first[0].lost) == (True, True, False)
    assert (second[0].stale, second[0].won, second[0].lost) == (True, False, True)
    # The token went to another client: this caller is served the stale value at once.
    assert stampede.fetch("ms:key", lambda: "new", 60).outcome == "stale"


def test_a_long_cold_compute_never_extends_a_writers_item(cluster: Cluster) -> None:
    """The keepalive of a won placeholder goes by its cas: a writer's item keeps its own TTL."""
    stampede = Stampede(cluster, StampedePolicy(lock_timeout=3))
    written = threading.Event()

    def compute() -> str:
        time.sleep(0.5)
        cluster.set("kept:key", "the writer's", 2)  # a writer replaces the placeholder
        written.set()
        time.sleep(3.5)  # past a keepalive beat (every lock_timeout / 3)
        return "computed"

    assert stampede.fetch("kept:key", compute, 60).value == "computed"
    assert written.is_set()
    # The fill did not land over the writer's value, and its 2 s TTL was never renewed.
    assert cluster.get("kept:key") is None


def test_a_failed_mark_stale_never_invalidates_what_the_key_holds_by_then(
    cluster: Cluster,
) -> None:
    """mark_stale's invalidation names the version it wrote: a filler's lease survives."""
    stampede = Stampede(cluster, StampedePolicy(wait=2))
    stampede.fetch("ms:race", lambda: "v1", 60)
    found, cas = cluster.gets_envelope("ms:race")  # mark_stale's read...
    assert cas is not None
    cluster.delete("ms:race")  # ...a writer deletes, a filler wins the miss...
    filling = threading.Thread(
        target=lambda: stampede.fetch("ms:race", lambda: (time.sleep(1), "v2")[1], 60)
    )
    filling.start()
    time.sleep(0.3)
    stale = dataclasses.replace(found, soft_expiry=time.time())
    assert not cluster.cas_stale("ms:race", stale, cas, 60)  # ...and the stale write fails
    filling.join()
    impatient = Stampede(cluster, StampedePolicy(wait=0))  # a wedged placeholder would raise
    assert impatient.fetch("ms:race", lambda: "v3", 60).value == "v2"  # the fill landed
