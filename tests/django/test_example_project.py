"""The README's first command starts the example site and it answers."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.harness import free_port

ROOT = Path(__file__).resolve().parents[2]


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


def _wait_for(url: str, process: subprocess.Popen, deadline: float) -> tuple[int, str]:
    while True:
        if process.poll() is not None:
            output = process.stdout.read() if process.stdout else ""
            pytest.fail(f"the example exited with {process.returncode}:\n{output}")
        try:
            return _get(url)
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"the example did not answer on {url}")
            time.sleep(0.3)


@pytest.mark.slow
def test_readme_command_serves_the_example_on_the_embedded_cache():
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MEMCACHED_SERVERS"}
    env["PORT"] = str(port)
    process = subprocess.Popen(
        ["bash", "scripts/run-example.sh"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # so the whole process group can be stopped
    )
    try:
        url = f"http://127.0.0.1:{port}/"
        status, body = _wait_for(url, process, time.monotonic() + 300)
        assert status == 200
        assert "LocMemPatternsCache" in body
        assert "computed" in body
        status, body = _get(url)  # the second request is served from the cache
        assert status == 200
        assert "served from the cache" in body
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)
