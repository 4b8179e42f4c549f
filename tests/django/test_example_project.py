"""The README's first command starts the example site and it answers."""

from __future__ import annotations

import pytest

from tests.harness import http_get, serve_example, server_counters

SCRIPT = "scripts/run-example.sh"  # the README's command


def _check_pages(url: str, first_page: str, backend: str) -> None:
    assert backend in first_page
    assert "computed" in first_page
    status, body = http_get(url)  # the second request is served from the cache
    assert status == 200
    assert "served from the cache" in body


@pytest.mark.slow
def test_readme_command_serves_the_example_on_the_embedded_cache():
    with serve_example(SCRIPT) as (url, first_page):
        _check_pages(url, first_page, "LocMemPatternsCache")


@pytest.mark.slow
def test_one_variable_switches_the_example_to_a_memcached_cluster(memcached_3):
    for server in memcached_3:
        server.flush()
    servers = ",".join(server.spec for server in memcached_3)
    with serve_example(SCRIPT, MEMCACHED_SERVERS=servers) as (url, first_page):
        _check_pages(url, first_page, "KetamaMemcacheCache")
    items = server_counters(memcached_3, ["curr_items"])["curr_items"]
    assert items >= 2  # the report and the view counter live on the cluster
