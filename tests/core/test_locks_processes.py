"""Locks between real processes on a real memcached: exclusion, crashes, late releases.

Each owner is its own Python process (``subprocess``), so nothing is shared but
memcached.  Critical sections are timed with ``CLOCK_MONOTONIC``, which is
system-wide on Linux, so intervals from different processes can be compared.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.exceptions import LockNotOwnedError
from django_mcpatterns.core.locks import Lock
from django_mcpatterns.core.options import ClusterOptions
from tests.conftest import flush
from tests.harness import PATIENCE, MemcachedServer, server_ttl

pytestmark = pytest.mark.slow  # processes of their own: a drill

ROOT = Path(__file__).resolve().parents[2]

# The owner process: acquire/release as told on stdin, report on stdout.
OWNER = textwrap.dedent(
    """
    import sys, time
    from django_mcpatterns.core.cluster import Cluster
    from django_mcpatterns.core.locks import Lock
    from django_mcpatterns.core.options import ClusterOptions
    from tests.harness import PATIENCE

    spec, key, timeout, protocol = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    options = ClusterOptions(protocol=protocol, timeout=PATIENCE, connect_timeout=PATIENCE)
    lock = Lock(Cluster([spec], options), key, timeout)
    for command in sys.stdin:
        command = command.strip()
        try:
            if command == "acquire":
                result = lock.acquire()
            elif command == "release":
                result = lock.release()
            else:
                continue
        except Exception as exc:
            result = type(exc).__name__
        print(command, result, flush=True)
    """
)

# A contender: N rounds of a read-modify-write of a counter under the lock.
CONTENDER = textwrap.dedent(
    """
    import sys, time
    from django_mcpatterns.core.cluster import Cluster
    from django_mcpatterns.core.locks import Lock
    from django_mcpatterns.core.options import ClusterOptions
    from tests.harness import PATIENCE

    spec, rounds, start_at = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    options = ClusterOptions(protocol=sys.argv[4], timeout=PATIENCE, connect_timeout=PATIENCE)
    cluster = Cluster([spec], options)
    time.sleep(max(0.0, start_at - time.time()))
    for _ in range(rounds):
        with Lock(cluster, "lock:counter", 10):
            entered = time.monotonic()
            count = cluster.get("counter")
            time.sleep(0.005)  # widen the window a lost update would need
            cluster.set("counter", count + 1)
            print(entered, time.monotonic(), flush=True)
    """
)


def python(code: str, *args: object, stdin: bool = False) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


class Owner:
    """A lock owner in another process."""

    def __init__(self, spec: str, key: str, timeout: float, protocol: str) -> None:
        self.process = python(OWNER, spec, key, timeout, protocol, stdin=True)

    def do(self, command: str) -> str:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        reply = self.process.stdout.readline().split()
        assert reply[:1] == [command], reply
        return reply[1]

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def close(self) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()  # end of commands: the owner exits by itself
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


@pytest.fixture
def server(memcached_1: list[MemcachedServer]) -> MemcachedServer:
    flush(memcached_1)
    return memcached_1[0]


@pytest.fixture(params=["meta", "text"])
def protocol(request: pytest.FixtureRequest) -> str:
    """Every drill runs over both protocols: the lock's commands differ (core/locks/)."""
    return str(request.param)


@pytest.fixture
def cluster(server: MemcachedServer, protocol: str) -> Iterator[Cluster]:
    options = ClusterOptions(protocol=protocol, timeout=PATIENCE, connect_timeout=PATIENCE)  # type: ignore[arg-type]
    cluster = Cluster([server.spec], options)
    yield cluster
    cluster.close()


@pytest.fixture
def owners() -> Iterator[list[Owner]]:
    started: list[Owner] = []
    yield started
    for owner in started:
        owner.close()


def test_contending_processes_never_overlap(
    server: MemcachedServer, cluster: Cluster, protocol: str
) -> None:
    processes, rounds = 4, 15
    cluster.set("counter", 0)
    start_at = time.time() + 1.0  # every process imported and connected by then
    contenders = [
        python(CONTENDER, server.spec, rounds, start_at, protocol) for _ in range(processes)
    ]
    intervals = []
    for process in contenders:
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0
        intervals += [tuple(map(float, line.split())) for line in out.splitlines()]
    assert cluster.get("counter") == processes * rounds  # no lost update
    intervals.sort()
    assert len(intervals) == processes * rounds
    for (_, left_end), (right_start, _) in itertools.pairwise(intervals):
        assert left_end <= right_start  # critical sections are disjoint


def test_a_sigkilled_holder_frees_the_lock_after_its_ttl(
    server: MemcachedServer, cluster: Cluster, owners: list[Owner], protocol: str
) -> None:
    holder = Owner(server.spec, "lock:crash", 1, protocol)
    owners.append(holder)
    assert holder.do("acquire") == "True"
    holder.kill()  # no release, no cleanup
    waiter = Lock(cluster, "lock:crash", 10)
    assert waiter.acquire(blocking=False) is False  # still held by the dead process
    # memcached drops it at most ceil(timeout) + 1 s after the add (whole seconds), by the
    # TTL it holds; then the waiter takes it.
    assert 0 < server_ttl(server, "lock:crash") <= 2
    assert waiter.acquire(blocking_timeout=5) is True
    waiter.release()


def test_a_late_release_leaves_the_new_owners_lock_alone(
    server: MemcachedServer, cluster: Cluster, owners: list[Owner], protocol: str
) -> None:
    late = Owner(server.spec, "lock:late", 1, protocol)
    owners.append(late)
    assert late.do("acquire") == "True"
    mine = Lock(cluster, "lock:late", 30)
    assert mine.acquire(blocking_timeout=5)  # after the late owner's TTL lapsed
    assert late.do("release") == LockNotOwnedError.__name__
    assert mine.owned()
    mine.release()
