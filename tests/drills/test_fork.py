"""Fork drill: a cluster used before ``fork`` keeps its guarantees in every child.

The parent uses its pools (a ``get_many`` over three servers) and holds a lock,
then forks four children (``multiprocessing``, fork start method) that loop
lock / add / get_many / get on the same servers while the parent keeps reading.
Had the children inherited the parent's pooled sockets, they would read each
other's replies: locks "acquired" while another owner holds them, values of
other keys, stray exceptions.  Every answer is checked against what memcached
holds; nothing may be wrong.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.health import Admission
from django_mcpatterns.core.locks import Lock
from django_mcpatterns.core.options import ClusterOptions
from tests import forked
from tests.fakes import FakeClock
from tests.harness import MemcachedServer, cluster_on

pytestmark = pytest.mark.slow

KEYS = [f"fork:key:{i}" for i in range(60)]
HELD = "fork:held"  # the parent's lock, held for the whole drill
SHARED = "fork:shared"  # the children's lock: one owner at a time
CHILDREN = 4
SECONDS = 2.0  # each child's loop (bounded by ROUNDS as well)
ROUNDS = 400


def expected(key: str) -> str:
    return f"value of {key}"


def drill(cluster: Cluster, deadline: float) -> Counter[str]:
    """Loop the commands whose answers the fork would mix up; count what went wrong."""
    counts: Counter[str] = Counter()
    me = os.getpid()
    for i in range(ROUNDS):
        if time.monotonic() > deadline:
            break
        counts["rounds"] += 1
        try:
            if Lock(cluster, HELD, 30).acquire(blocking=False):
                counts["stolen locks"] += 1  # the parent holds it all along
            shared = Lock(cluster, SHARED, 30)
            if shared.acquire(blocking=False):
                if cluster.get(SHARED) != shared.token:
                    counts["stolen locks"] += 1  # "acquired" while another owner held it
                shared.release()
            fresh = f"fork:add:{me}:{i}"
            if not cluster.add(fresh, me, 60) or cluster.add(fresh, -1, 60):
                counts["wrong answers"] += 1  # an add reported other than memcached decided
            found = cluster.get_many(KEYS[i % 7 :: 3])
            counts["wrong values"] += sum(v != expected(k) for k, v in found.items())
            counts["misses"] += len(KEYS[i % 7 :: 3]) - len(found)
            key = KEYS[i % len(KEYS)]
            value = cluster.get(key)
            if value is None:
                counts["misses"] += 1
            elif value != expected(key):
                counts["wrong values"] += 1
        except Exception as exc:
            counts[f"exceptions ({type(exc).__name__})"] += 1
    return counts


def child(cluster: Cluster, deadline: float, results: multiprocessing.Queue) -> None:
    forked.dump_stacks_on_signal()
    results.put(dict(drill(cluster, deadline)))


@pytest.fixture
def cluster(memcached_3: list[MemcachedServer]) -> Iterator[Cluster]:
    with cluster_on(memcached_3) as cluster:
        yield cluster


def test_children_never_use_the_connections_they_inherit(cluster: Cluster) -> None:
    assert cluster.set_many({key: expected(key) for key in KEYS}) == []
    assert len(cluster.get_many(KEYS)) == len(KEYS)  # every server's pool is in use
    held = Lock(cluster, HELD, 30)
    assert held.acquire(blocking=False)

    context = multiprocessing.get_context("fork")
    results: multiprocessing.Queue = context.Queue()
    deadline = time.monotonic() + SECONDS
    children = [
        context.Process(target=child, args=(cluster, deadline, results)) for _ in range(CHILDREN)
    ]
    for process in children:
        process.start()
    totals = drill(cluster, deadline)  # the parent keeps using its connections meanwhile
    for _ in children:
        totals.update(results.get(timeout=60))
    for process in children:
        forked.join(process, 10)
        assert process.exitcode == 0

    held.release()  # still the parent's: nobody took it over
    print(f"fork drill over {CHILDREN} children and the parent: {dict(totals)}")
    wrong = {name: n for name, n in totals.items() if n and name not in {"rounds", "misses"}}
    assert wrong == {}
    assert totals["rounds"] >= CHILDREN + 1


# -- which connections a child uses ---------------------------------------------------


def local_ports(cluster: Cluster) -> set[int]:
    """The client-side ports of the connections pooled in this process."""
    return {
        client.sock.getsockname()[1]
        for node in cluster._nodes.values()
        for client in node.pool.free
        if client.sock is not None
    }


def in_child(fork: Callable[[], int], work: Callable[[], object]) -> object:
    """Run ``work`` in a child made by ``fork``; return what it returned (as JSON)."""
    read_end, write_end = os.pipe()
    pid = fork()
    if pid == 0:  # the child: report, and leave without running the parent's cleanup
        try:
            os.write(write_end, json.dumps(work()).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reply:
        found = json.loads(reply.read() or b"null")
    os.waitpid(pid, 0)
    return found


FORKS = {
    "os.fork": os.fork,  # gunicorn, Celery (billiard), multiprocessing: Python's hooks run
    # uWSGI forks from C: Python's at-fork hooks do not run, only the pid tells.
    "fork(2) without Python's hooks": ctypes.CDLL(None, use_errno=True).fork,
}


@pytest.mark.parametrize("fork", FORKS.values(), ids=FORKS.keys())
def test_a_child_opens_its_own_connections_and_leaves_the_parents_alone(
    cluster: Cluster, fork: Callable[[], int]
) -> None:
    cluster.set_many({key: expected(key) for key in KEYS})
    assert len(cluster.get_many(KEYS)) == len(KEYS)
    parents = local_ports(cluster)
    assert len(parents) == 3

    def work() -> object:
        return [
            cluster.get_many(KEYS) == {k: expected(k) for k in KEYS},
            sorted(local_ports(cluster)),
        ]

    answered, childs = in_child(fork, work)  # type: ignore[misc]
    assert answered
    assert len(childs) == 3
    assert not parents & set(childs)  # not one inherited connection was used
    # Closing its copies sent nothing: the parent's connections still answer.
    assert len(cluster.get_many(KEYS)) == len(KEYS)
    assert local_ports(cluster) == parents


def test_a_child_starts_from_the_parents_view_of_a_server_without_its_probe(
    memcached_1: list[MemcachedServer],
) -> None:
    clock = FakeClock()
    cluster = Cluster([memcached_1[0].spec], ClusterOptions(retry_timeout=1.0), clock=clock)
    (node,) = cluster._nodes.values()
    node.health.failed(OSError("drill"), Admission(0))
    clock.advance(1.5)
    probe = node.health.admit()
    assert probe is not None
    assert probe.probe  # a parent thread is probing at the fork

    def work() -> object:
        failures = node.health.failures  # the parent's view...
        admission = node.health.admit()
        return [failures, admission is not None and admission.probe]  # ...but its own probe

    assert in_child(os.fork, work) == [1, True]
