"""The Flask example: every page works, and the documented command serves it."""

from __future__ import annotations

import urllib.parse
import urllib.request
from typing import Any

import pytest

from tests.harness import http_get, serve_example

SCRIPT = "scripts/run-flask-example.sh"  # the documented command


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


def test_editing_an_item_invalidates_every_cached_variant(client: Any) -> None:
    usd, eur = client.get("/items/widget").text, client.get("/items/widget?currency=eur").text
    assert "<b id='note'>none</b>" in usd
    assert "<b id='currency'>eur</b>" in eur
    assert client.get("/items/widget").text == usd  # cached in the item's namespace
    gadget = client.get("/items/gadget").text
    edited = client.post("/items/widget/edit", data={"note": "on sale"})
    assert (edited.status_code, edited.location) == (302, "/items/widget")
    for url in ("/items/widget", "/items/widget?currency=eur"):
        assert "<b id='note'>on sale</b>" in client.get(url).text
    assert client.get("/items/gadget").text == gadget  # another namespace: still cached


def test_user_input_is_escaped(client: Any) -> None:
    assert "<script>" not in client.get("/price/<script>").text
    client.post("/items/widget/edit", data={"note": "<script>"})
    assert "<script>" not in client.get("/items/<script>").text
    assert "<script>" not in client.get("/items/widget").text


def test_the_documented_command_serves_the_example() -> None:
    with serve_example(SCRIPT) as (url, _):
        status, body = http_get(url + "report")
        assert status == 200
        assert "LocMemPatternsCache" in body


def test_memcached_servers_switches_it_to_the_cluster(memcached_3: Any) -> None:
    for server in memcached_3:
        server.flush()
    servers = ",".join(server.spec for server in memcached_3)
    with serve_example(SCRIPT, MEMCACHED_SERVERS=servers) as (url, _):
        status, body = http_get(url + "report")
        assert status == 200
        assert "KetamaMemcachedCache" in body
        assert http_get(url + "report") == (status, body)  # the second one comes from the cluster
        assert "<b id='note'>none</b>" in http_get(url + "items/widget")[1]
        assert http_post(url + "items/widget/edit", note="from another client") == 200
        assert "<b id='note'>from another client</b>" in http_get(url + "items/widget")[1]


def http_post(url: str, **form: str) -> int:
    """POST a form (a redirect is followed with a GET, as a browser does); return the status."""
    data = urllib.parse.urlencode(form).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=5) as response:
        return response.status
