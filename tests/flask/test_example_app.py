"""The Flask example: every page works, and the documented command serves it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.harness import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def client() -> Any:
    from example_project.flask_app import create_app

    return create_app({"CACHE_TYPE": "django_mcpatterns.flask.LocMemPatternsCache"}).test_client()


def test_every_pattern_page_answers(client: Any) -> None:
    assert "Home page views: <b id='views'>1</b>" in client.get("/").text
    assert "<b id='views'>2</b>" in client.get("/").text
    first = client.get("/report").text
    assert client.get("/report").text == first  # served from the stampede-guarded cache
    assert "<b id='price'>7.5</b>" in client.get("/price/widget").text
    assert "<p id='tags'>none</p>" in client.get("/tags/widget").text
    assert client.get("/tags/widget/add/red").status_code == 302
    assert "<p id='tags'>red</p>" in client.get("/tags/widget").text
    client.get("/log")
    assert client.get("/log").text.count(":") >= 4  # two timestamps
    assert "ran the job" in client.get("/nightly-job").text


def test_user_input_is_escaped(client: Any) -> None:
    assert "<script>" not in client.get("/price/<script>").text


@contextmanager
def serve(**env_vars: str) -> Iterator[str]:
    """Run the documented command, ``bash scripts/run-flask-example.sh``."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MEMCACHED_SERVERS"}
    env.update(env_vars, PORT=str(port))
    process = subprocess.Popen(
        ["bash", "scripts/run-flask-example.sh"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 300  # the first run installs the project
    try:
        while True:
            if process.poll() is not None:
                output = process.stdout.read() if process.stdout else ""
                pytest.fail(f"the Flask example exited with {process.returncode}:\n{output}")
            try:
                with urllib.request.urlopen(url, timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the Flask example did not answer on {url}")
                time.sleep(0.2)
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=10)


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


def test_the_documented_command_serves_the_example() -> None:
    with serve() as url:
        status, body = get(url + "report")
        assert status == 200
        assert "LocMemPatternsCache" in body


def test_memcached_servers_switches_it_to_the_cluster(memcached_3: Any) -> None:
    for server in memcached_3:
        server.flush()
    servers = ",".join(server.spec for server in memcached_3)
    with serve(MEMCACHED_SERVERS=servers) as url:
        status, body = get(url + "report")
        assert status == 200
        assert "KetamaMemcachedCache" in body
        assert get(url + "report") == (status, body)  # the second one comes from the cluster
