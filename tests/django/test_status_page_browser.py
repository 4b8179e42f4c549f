"""The example's status page in a real headless browser (Debian's chromium via Playwright).

The example site runs on a 4-server memcached cluster with one server killed;
the page must draw the ring, show each server's share, the dead server and the
counters, as a person would see them.  A screenshot is saved under the test's
tmp_path and its path printed (``pytest -s`` shows it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from django_mcpatterns.core.ketama import Continuum
from tests.harness import MemcachedServer, free_port, require_binary, require_module

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = pytest.mark.slow


def require_playwright() -> object:
    """Playwright's sync API; skip (fail under CI) when the package is missing."""
    return require_module("playwright.sync_api", "pip install -e '.[test]'").sync_playwright


def get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as response:
        response.read()
        return response.status


@contextmanager
def example_site(servers: list[MemcachedServer], database: Path) -> Iterator[str]:
    """Run the example with runserver on a free loopback port, on a fresh SQLite
    ``database``; yield its base URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_DEBUG"}}
    env.update(
        DJANGO_SETTINGS_MODULE="example_site.settings",
        MEMCACHED_SERVERS=",".join(s.spec for s in servers),
        PYTHONPATH=str(ROOT),
        EXAMPLE_DATABASE=str(database),
    )
    manage = [sys.executable, "example_project/manage.py"]
    subprocess.run([*manage, "migrate", "--noinput"], cwd=ROOT, env=env, check=True)
    process = subprocess.Popen(
        [*manage, "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"the example exited:\n{process.stdout.read()}")  # type: ignore[union-attr]
            try:
                get(url + "/")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("the example did not answer")
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_status_page_in_chromium(memcached_4_fresh: list[MemcachedServer], tmp_path: Path):
    chromium = require_binary("chromium")
    sync_playwright = require_playwright()
    specs = [s.spec for s in memcached_4_fresh]
    dead = specs[3]
    with example_site(memcached_4_fresh, tmp_path / "db.sqlite3") as url:
        get(url + "/")
        get(url + "/")  # the second view reads the cached report: hits
        memcached_4_fresh[3].kill()
        get(url + "/status/")  # asking for stats: the first failure...
        time.sleep(1.2)  # ...retry_timeout (1 s) later, the second: dead (retry_attempts=2)
        with sync_playwright() as playwright:  # type: ignore[operator]
            browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(url + "/status/")
                screenshot = tmp_path / "status-page.png"
                page.screenshot(path=str(screenshot), full_page=True)
                print(f"\nstatus page screenshot: {screenshot}")

                # The ring: arcs in four colours, drawn at a real size.
                arcs = page.locator("svg.ring-chart circle.arc")
                assert arcs.count() > 4 * 20
                strokes = {arcs.nth(i).get_attribute("stroke") for i in range(arcs.count())}
                assert len(strokes) == 4
                box = page.locator("svg.ring-chart g").bounding_box()
                assert box is not None
                assert box["width"] > 150
                assert box["height"] > 150
                assert page.locator("svg.share-bar rect.bar").count() == 4

                # Shares: the ring's own numbers, one per server.
                shares = Continuum(specs).shares()
                for spec in specs:
                    row = page.locator(f"table.shares tr[data-node='{spec}']")
                    assert row.locator("td.share").inner_text() == f"{shares[spec] * 100:.1f}%"

                # Health and stats: three servers answer, the killed one is dead.
                for spec in specs:
                    row = page.locator(f"table.servers tr[data-node='{spec}']")
                    state = row.locator(".state").inner_text()
                    if spec == dead:
                        assert state == "dead"
                        assert "Connection refused" in row.inner_text()
                    else:
                        assert state == "up"
                        assert row.locator("td.hits").inner_text().isdigit()
                        assert row.locator("td.items").inner_text().isdigit()
                hits = page.locator("table.servers td.hits").all_inner_texts()
                assert sum(int(h) for h in hits) >= 1  # the second home page view

                # Counters: the dead server was counted by the signal.
                dead_count = page.locator("tr[data-counter='node_dead'] td.count")
                assert dead_count.inner_text() == "1"
                assert page.locator("table.counters tr[data-counter]").count() >= 2
            finally:
                browser.close()
