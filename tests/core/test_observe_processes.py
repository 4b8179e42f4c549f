"""prometheus_client's multiprocess mode: two forked workers' metrics add up in one scrape."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import flush
from tests.harness import MemcachedServer

# What gunicorn does: the app (and its cluster) built once, workers forked from it,
# each counting into its own files under PROMETHEUS_MULTIPROC_DIR; the exporter sums them.
WORKERS = textwrap.dedent(
    """
    import os, sys
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    from django_mcpatterns.core.cluster import Cluster
    from django_mcpatterns.core.options import ClusterOptions

    cluster = Cluster([sys.argv[1]], ClusterOptions(instrumentation=("prometheus",)))
    children = []
    for worker, writes in enumerate((3, 4)):
        pid = os.fork()
        if pid == 0:
            for i in range(writes):
                cluster.set(f"worker{worker}:{i}", i)
            cluster.get(f"worker{worker}:0")  # its own: the workers run side by side
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
        multiprocess.mark_process_dead(pid)  # gunicorn's child_exit hook
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    sys.stdout.write(generate_latest(registry).decode())
    """
)


def test_two_forked_workers_aggregate(memcached_1: list[MemcachedServer], tmp_path: Path) -> None:
    flush(memcached_1)
    spec = memcached_1[0].spec
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", WORKERS, spec],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(result.stdout)
        for sample in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return found[(name, tuple(sorted({"cache": "default", "server": spec, **labels}.items())))]

    assert value("mcpatterns_commands_total", command="set", outcome="stored") == 7
    assert value("mcpatterns_commands_total", command="get", outcome="hit") == 2
    assert value("mcpatterns_command_seconds_count", command="set") == 7
    assert value("mcpatterns_server_up") == 1  # the live process's view; the dead workers' dropped
    assert len(list(tmp_path.glob("counter_*.db"))) >= 2  # one file per worker


# A worker scrapes while it (and the master) are alive: what a dashboard sees all day.
LIVE_WORKER = textwrap.dedent(
    """
    import os, sys
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess
    from django_mcpatterns.core.cluster import Cluster
    from django_mcpatterns.core.options import ClusterOptions

    cluster = Cluster([sys.argv[1]], ClusterOptions(instrumentation=("prometheus",)))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        cluster.set("live", 1)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        os.write(write, generate_latest(registry))
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.waitpid(pid, 0)
    sys.stdout.write(b"".join(chunks).decode())
    """
)


def test_a_live_forked_worker_reports_its_servers_up(
    memcached_1: list[MemcachedServer], tmp_path: Path
) -> None:
    """prometheus_client resets every value of a forked worker to 0 on its first use: the
    server_up gauge (livemin over the live workers) must not then say every server is down."""
    spec = memcached_1[0].spec
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", LIVE_WORKER, spec],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    up = [
        sample.value
        for family in text_string_to_metric_families(result.stdout)
        for sample in family.samples
        if sample.name == "mcpatterns_server_up" and sample.labels["server"] == spec
    ]
    assert up == [1]
