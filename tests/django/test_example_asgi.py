"""The example site under uvicorn, started exactly as the README says, serves its async pages.

The README's uvicorn line is read from the README itself (only its port is
changed, to a free loopback one), so the command a user copies is the one
tested.  The site runs on a fresh database of its own, on the embedded cache
and on a 3-server memcached cluster; uvicorn is stopped by its process group.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from django_mcpatterns.backend import LocMemPatternsCache
from tests.harness import LOOPBACK, ROOT, MemcachedServer, free_port, require_module

pytestmark = pytest.mark.slow

STARTUP_SECONDS = 60
TALLIES = 20


def readme_uvicorn_command(port: int) -> list[str]:
    """The README's uvicorn command, on ``port``."""
    lines = [
        line.strip()
        for line in (ROOT / "README.md").read_text().splitlines()
        if "-m uvicorn" in line and not line.lstrip().startswith("#")
    ]
    assert len(lines) == 1, f"the README should name one uvicorn command, not {lines}"
    command = re.sub(r"--port \d+", f"--port {port}", lines[0])
    assert f"--port {port}" in command
    return shlex.split(command)


def patterns_landed() -> bool:
    return all(hasattr(LocMemPatternsCache, name) for name in ("asadd", "aget_or_compute"))


def fetch(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=20) as response:
        return response.status, response.read().decode()


@pytest.fixture(params=["embedded", "memcached"])
def asgi_site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    require_module("uvicorn", "pip install -e '.[test]'")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"MEMCACHED_SERVERS", "DJANGO_SETTINGS_MODULE"}
    }
    env["EXAMPLE_DATABASE"] = str(tmp_path / "db.sqlite3")
    env["PYTHONPATH"] = str(ROOT)
    if request.param == "memcached":
        import importlib.util

        if importlib.util.find_spec("django_mcpatterns.core.aio") is None:
            pytest.skip("the AsyncCluster (django_mcpatterns.core.aio) has not landed yet")
        servers: list[MemcachedServer] = request.getfixturevalue("memcached_3")
        for server in servers:
            server.flush()
        env["MEMCACHED_SERVERS"] = ",".join(server.spec for server in servers)
    # What run-example.sh does first: the database.
    subprocess.run(
        [sys.executable, "example_project/manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "example_site.settings"},
        check=True,
        capture_output=True,
        timeout=120,
    )
    port = free_port()
    log = (tmp_path / "uvicorn.log").open("w")
    process = subprocess.Popen(
        readme_uvicorn_command(port),
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, stopped below
    )
    url = f"http://{LOOPBACK}:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                pytest.fail(f"uvicorn exited with {process.returncode}: {_log(tmp_path)}")
            try:
                fetch(url + "/")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"uvicorn did not answer on {url}: {_log(tmp_path)}")
                time.sleep(0.2)
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        log.close()


def _log(tmp_path: Path) -> str:
    return (tmp_path / "uvicorn.log").read_text()[-3000:]


def test_sync_pages_still_work_under_asgi(asgi_site: str) -> None:
    status, body = fetch(asgi_site + "/")
    assert status == 200
    assert "members" in body.lower()


def test_async_pages(asgi_site: str) -> None:
    if not patterns_landed():
        pytest.skip("asadd / aget_or_compute are not on this branch yet")
    first: dict[str, Any] = json.loads(fetch(asgi_site + "/async/")[1])
    assert first["visits"] == 1
    assert first["visitors"] == 1
    assert first["counts"]["members"] > 0
    second: dict[str, Any] = json.loads(fetch(asgi_site + "/async/")[1])
    assert second["visits"] == 2
    assert second["counts"] == first["counts"]  # computed once, then served from the cache

    # Concurrent read-modify-writes under `async with cache.lock(...)`: none is lost.
    with ThreadPoolExecutor(10) as visitors:
        answers = list(visitors.map(lambda _: fetch(asgi_site + "/async/tally/"), range(TALLIES)))
    assert {status for status, _ in answers} == {200}
    assert sorted(json.loads(body)["tally"] for _, body in answers) == list(range(1, TALLIES + 1))

    status, front = fetch(asgi_site + "/async/front/")
    assert status == 200
    assert fetch(asgi_site + "/async/front/")[1] == front  # the stampede-guarded page, cached
