"""A stall is not a restart (issue 23 item 1, "a server that restarted empty is recognised").

memcached's epoch is its pid and start time, from ``stats``.  A process reads a
server's epoch only after an outage there (no request is added before one), so
at its first outage it judges by uptime.  Before, it compared that uptime with
the outage's length: a server started less than the outage's length plus 3 s
before a stall was reported as "restarted" (a false warning, the restart
listeners told).  Now it compares it with the time since this process first
connected to the server (noted when the connection opened): a server up longer
than that did not restart, whenever it started.  Real servers, stalled with
SIGSTOP and killed with SIGKILL; a fake clock where the time since the first
connection matters; waits wait for the judgment, nothing is timed.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator

import pytest

from django_mcpatterns.core.cluster import Cluster
from django_mcpatterns.core.options import ClusterOptions
from tests.core.test_outages import cluster_of, wait_for
from tests.fakes import FakeClock
from tests.harness import MemcachedServer, memcached_cluster


@pytest.fixture
def young() -> Iterator[MemcachedServer]:
    """A server started just now: about 2 s up by its own count."""
    with memcached_cluster(1) as servers:
        yield servers[0]


def judged(cluster: Cluster) -> list[float]:
    """The outage lengths the repairer judged this cluster's servers after (filled as it does)."""
    shared, lengths = cluster.shared, list[float]()
    lock, read = threading.Lock(), shared._read_epoch

    def reading(name: str, down: float | None) -> None:
        read(name, down)
        if down is not None:
            with lock:
                lengths.append(down)

    shared._read_epoch = reading  # type: ignore[method-assign]
    return lengths


def restarted_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "restarted" in r.getMessage()]


def test_a_stall_soon_after_a_server_started_is_not_a_restart_and_a_restart_is(
    young: MemcachedServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="django_mcpatterns.cluster")
    cluster = cluster_of([young])
    restarts: list[str] = []
    cluster.listen(on_restart=restarts.append)
    lengths = judged(cluster)
    assert cluster.set("k", 1)
    young.pause()
    try:
        assert cluster.get("k") is None  # times out: the outage begins
    finally:
        young.resume()
    wait_for(lambda: cluster.get("k") == 1, "the server back")
    wait_for(lambda: len(lengths) == 1, "the repairer's judgment")
    # Before: "restarted (up 2s): everything it held is gone", and the listeners told.
    assert restarted_lines(caplog) == []
    assert restarts == []
    assert young.spec in cluster.epochs()  # read after the outage: the next one compares pids
    young.kill()
    assert cluster.get("k") is None  # refused: the outage begins
    young.start()  # a real restart, on the same port, as young as the first
    wait_for(lambda: bool(cluster.set("k", 2)) and cluster.get("k") == 2, "the new server")
    wait_for(lambda: len(lengths) == 2, "the repairer's judgment")
    assert restarts == [young.spec]
    assert len(restarted_lines(caplog)) == 1


def test_a_restart_at_a_process_s_first_outage_is_recognised(young: MemcachedServer) -> None:
    clock = FakeClock()
    options = ClusterOptions(timeout=0.3, connect_timeout=0.3, retry_timeout=0.05)
    cluster = Cluster([young.spec], options, clock=clock)
    restarts: list[str] = []
    cluster.listen(on_restart=restarts.append)
    lengths = judged(cluster)
    assert cluster.set("k", 1)  # met now; its epoch is not read (no request is added for it)
    clock.advance(60)  # a minute on, it is killed and restarted: younger than the meeting
    young.kill()
    assert cluster.get("k") is None
    young.start()
    clock.advance(1)  # past the retry wait: the next request probes it

    def back() -> bool:
        clock.advance(1)
        return bool(cluster.set("k", 2)) and cluster.get("k") == 2

    wait_for(back, "the new server")
    wait_for(lambda: len(lengths) == 1, "the repairer's judgment")
    assert restarts == [young.spec]


def test_the_async_driver_s_first_connection_is_noted_too(young: MemcachedServer) -> None:
    clock = FakeClock()
    cluster = Cluster([young.spec], clock=clock)
    clock.advance(5)
    assert cluster.shared.met == {}
    assert asyncio.run(cluster.aio.set("k", 1))  # the asyncio channel is the first connection
    assert cluster.shared.met == {young.spec: clock()}
