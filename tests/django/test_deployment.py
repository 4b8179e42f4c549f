"""The example site under ``gunicorn --preload``: workers forked after the cache was used.

The drill app (``tests/django/deployment``) uses the cache in ``AppConfig.ready()``,
so with ``--preload`` the gunicorn master opens connections before it forks
four workers (sync, then gthread).  Concurrent visitors then hit a
lock-protected critical section (and try a lock the master holds) and a
multi-get.  Workers that shared the master's sockets would read each other's
replies: 500s, two workers inside the critical section at once, the master's
lock taken, values of other keys.  None of that may happen.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.harness import LOOPBACK, ROOT, MemcachedServer, free_port, require_module
from tests.processes import ServerProcess

pytestmark = pytest.mark.slow

REQUESTS = 400  # per run: half critical sections, half multi-gets
VISITORS = 8


@pytest.fixture
def gunicorn_site(
    request: pytest.FixtureRequest, memcached_3: list[MemcachedServer], tmp_path: Path
) -> Iterator[str]:
    """Serve the drill site with ``gunicorn --preload -w 4`` and the worker class given."""
    require_module("gunicorn", "pip install -e '.[test]'")
    for server in memcached_3:
        server.flush()
    port = free_port()
    worker = ["-k", "gthread", "--threads", "4"] if request.param == "gthread" else ["-k", "sync"]
    command = [
        *(sys.executable, "-m", "gunicorn", "--preload", "-w", "4", *worker),
        *("-b", f"{LOOPBACK}:{port}", "--timeout", "30", "--graceful-timeout", "5"),
        *("--chdir", str(ROOT / "example_project"), "--pythonpath", str(ROOT)),
        "example_site.wsgi:application",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.django.deployment.settings",
        "MEMCACHED_SERVERS": ",".join(server.spec for server in memcached_3),
        "EXAMPLE_DATABASE": str(tmp_path / "db.sqlite3"),
    }
    log = (tmp_path / "gunicorn.log").open("w")
    executor = ServerProcess(
        command, (LOOPBACK, port), name="gunicorn", env=env, output=log, timeout=30
    )
    executor.start()
    try:
        time.sleep(1.0)  # the port answers once the master listens: let the workers boot
        yield f"http://{LOOPBACK}:{port}"
    finally:
        executor.stop()
        log.close()
        print((tmp_path / "gunicorn.log").read_text()[-3000:])


def visit(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, {}


@pytest.mark.parametrize("gunicorn_site", ["sync", "gthread"], indirect=True)
def test_preloaded_workers_keep_locks_exclusive_and_values_their_keys(gunicorn_site: str) -> None:
    paths = ["/critical/", "/multiget/"] * (REQUESTS // 2)
    with ThreadPoolExecutor(VISITORS) as visitors:
        answers = list(visitors.map(lambda path: (path, *visit(gunicorn_site + path)), paths))

    statuses = Counter(status for _, status, _ in answers)
    sections = sorted(
        (body["entered"], body["left"])
        for path, status, body in answers
        if path == "/critical/" and status == 200 and body["acquired"]
    )
    overlaps = sum(entered < left for (_, left), (entered, _) in itertools.pairwise(sections))
    stolen = sum(bool(body.get("stolen")) for _, _, body in answers)
    reads = [body for path, status, body in answers if path == "/multiget/" and status == 200]
    wrong = sum(int(body["wrong"]) for body in reads)  # type: ignore[call-overload]
    missing = sum(int(body["missing"]) for body in reads)  # type: ignore[call-overload]
    print(
        f"statuses {dict(statuses)}, critical sections {len(sections)}, overlaps {overlaps}, "
        f"stolen locks {stolen}, wrong values {wrong}, misses {missing}"
    )
    assert statuses == {200: REQUESTS}
    assert overlaps == 0
    assert stolen == 0
    assert wrong == 0
    assert len(sections) == REQUESTS // 2  # every visitor got the lock within its wait
