"""The README's first command starts the example site and it answers."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.harness import free_port

ROOT = Path(__file__).resolve().parents[2]


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


@contextmanager
def serve_example(**env_vars: str) -> Iterator[tuple[str, str]]:
    """Run ``bash scripts/run-example.sh`` as the README says.

    Yield the URL and the first page served (status 200) once it answers.
    """
    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"MEMCACHED_SERVERS", "DJANGO_SETTINGS_MODULE"}
    }
    env.update(PORT=str(port), **env_vars)
    process = subprocess.Popen(
        ["bash", "scripts/run-example.sh"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # so the whole process group can be stopped
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 300  # the first run installs the project
    try:
        while True:
            if process.poll() is not None:
                output = process.stdout.read() if process.stdout else ""
                pytest.fail(f"the example exited with {process.returncode}:\n{output}")
            try:
                status, first_page = _get(url)
                assert status == 200
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the example did not answer on {url}")
                time.sleep(0.3)
        yield url, first_page
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=10)


def _check_pages(url: str, first_page: str, backend: str) -> None:
    assert backend in first_page
    assert "computed" in first_page
    status, body = _get(url)  # the second request is served from the cache
    assert status == 200
    assert "served from the cache" in body


@pytest.mark.slow
def test_readme_command_serves_the_example_on_the_embedded_cache():
    with serve_example() as (url, first_page):
        _check_pages(url, first_page, "LocMemPatternsCache")


@pytest.mark.slow
def test_one_variable_switches_the_example_to_a_memcached_cluster(memcached_3):
    for server in memcached_3:
        server.flush()
    servers = ",".join(server.spec for server in memcached_3)
    with serve_example(MEMCACHED_SERVERS=servers) as (url, first_page):
        _check_pages(url, first_page, "KetamaMemcacheCache")
    items = sum(server_stats(s)["curr_items"] for s in memcached_3)
    assert items >= 2  # the report and the view counter live on the cluster


def server_stats(server) -> dict[str, int]:
    from pymemcache.client.base import Client

    client = Client(("127.0.0.1", server.port))
    try:
        return {k.decode(): v for k, v in client.stats().items()}
    finally:
        client.close()
