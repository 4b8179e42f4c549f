"""The README's first command starts the example site, and its pages work.

The site is started exactly as the README says (``bash scripts/run-example.sh``),
on the embedded cache and, with one variable, on a 3-server memcached cluster;
its pages are then used as a visitor would, over HTTP, CSRF tokens included.
Each configuration is started once for the module (a start costs seconds), on a
fresh database of its own (``EXAMPLE_DATABASE``) rather than the checkout's.
Tests change different profiles, so they do not depend on each other's order.
"""

from __future__ import annotations

import http.cookiejar
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from typing import Any

import pytest

from tests.harness import serve_example, server_counters

pytestmark = pytest.mark.slow

SCRIPT = "scripts/run-example.sh"  # the README's command
# The seed migration's profiles get these ids in a fresh database.
EDITED, INTERESTED, READ_ONLY = 1, 2, 3


# -- a visitor ------------------------------------------------------------------------


@dataclass
class Response:
    status: int
    headers: Message
    body: str

    def text_of(self, element_id: str) -> str:
        return text_of(self.body, element_id)


def text_of(html: str, element_id: str) -> str:
    """The text of the element with this id (which has no nested tags)."""
    found = re.search(rf'id="{element_id}">([^<]*)<', html)
    assert found, f"no element #{element_id} in:\n{html}"
    return found[1]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the tests look at redirects themselves (POST-redirect-GET)


class Visitor:
    """A browser without JavaScript: keeps cookies, submits forms with their CSRF token."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()), _NoRedirect
        )

    def get(self, path: str) -> Response:
        return self._open(urllib.request.Request(self.url + path))

    def submit(self, page: str, action: str, **fields: str) -> Response:
        """GET ``page`` (for its CSRF cookie and token), then POST ``fields`` to ``action``."""
        form_page = self.get(page)
        assert form_page.status == 200
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form_page.body)
        assert token, f"no CSRF token on {page}"
        data = urllib.parse.urlencode({"csrfmiddlewaretoken": token[1], **fields}).encode()
        return self._open(urllib.request.Request(self.url + action, data=data, method="POST"))

    def _open(self, request: urllib.request.Request) -> Response:
        try:
            with self.opener.open(request, timeout=15) as response:
                return Response(response.status, response.headers, response.read().decode())
        except urllib.error.HTTPError as error:  # 3xx (not followed), 4xx, 5xx
            with error:
                return Response(error.code, error.headers, error.read().decode())


# -- the sites ------------------------------------------------------------------------


@dataclass
class Site:
    url: str
    first_page: str  # the front page as the start rendered it

    def visitor(self) -> Visitor:
        return Visitor(self.url)


def _start(tmp_path_factory: pytest.TempPathFactory, **env: str) -> Iterator[Site]:
    database = tmp_path_factory.mktemp("example") / "db.sqlite3"
    with serve_example(SCRIPT, EXAMPLE_DATABASE=str(database), **env) as (url, first_page):
        yield Site(url, first_page)


@pytest.fixture(scope="module")
def embedded_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    yield from _start(tmp_path_factory)


@pytest.fixture(scope="module")
def cluster_site(memcached_3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    for server in memcached_3:
        server.flush()
    servers = ",".join(server.spec for server in memcached_3)
    yield from _start(tmp_path_factory, MEMCACHED_SERVERS=servers)


@pytest.fixture(
    scope="module", params=["embedded_site", "cluster_site"], ids=["embedded", "cluster"]
)
def site(request: pytest.FixtureRequest) -> Site:
    return request.getfixturevalue(request.param)


# -- the README's command ---------------------------------------------------------------


def _check_front_page(site: Site, backend: str) -> None:
    """The front page names the backend, and the next request is served from the cache."""
    assert backend in site.first_page
    assert "Community report" in site.first_page
    visitor = site.visitor()
    again = visitor.get("/")
    assert again.status == 200
    # stampede_guard served the stored page: the report the start computed, with an Age.
    assert again.text_of("generated") == text_of(site.first_page, "generated")
    assert "Age" in again.headers
    assert visitor.get("/status/").status == 200  # linked from every page


def test_readme_command_serves_the_example_on_the_embedded_cache(embedded_site: Site):
    _check_front_page(embedded_site, "LocMemPatternsCache")


def test_one_variable_switches_the_example_to_a_memcached_cluster(cluster_site: Site, memcached_3):
    _check_front_page(cluster_site, "KetamaMemcacheCache")
    items = server_counters(memcached_3, ["curr_items"])["curr_items"]
    assert items >= 2  # the page and its header list (at least) live on the cluster


# -- the pages ------------------------------------------------------------------------


def _directory(page: Response) -> str:
    """The members sidebar of a page."""
    found = re.search(r'<ul id="directory">.*?</ul>', page.body, re.DOTALL)
    assert found, f"no members sidebar in:\n{page.body}"
    return found[0]


def _interests(page: Response) -> list[str]:
    """The interests a profile page lists (each has a remove form)."""
    return re.findall(r'<input type="hidden" name="name" value="([^"]*)">', page.body)


def test_saving_a_profile_invalidates_its_namespace(site: Site):
    visitor = site.visitor()
    path = f"/profiles/{EDITED}/"
    before = visitor.get(path)
    assert before.status == 200
    assert visitor.get(path).text_of("loaded") == before.text_of("loaded")  # cached

    saved = visitor.submit(
        f"{path}edit/", f"{path}edit/", name="Ada Lovelace", city="London", bio="Notes on engines."
    )
    assert (saved.status, saved.headers["Location"]) == (302, path)

    after = visitor.get(path)  # at once: the namespace was invalidated on save
    assert after.text_of("name") == "Ada Lovelace"
    assert '<div id="bio"><p>Notes on engines.</p></div>' in after.body
    assert after.text_of("loaded") != before.text_of("loaded")
    # The sidebar fragment's namespace ("directory") was invalidated with it.
    assert ">Ada Lovelace</a>" in _directory(after)
    assert visitor.get("/profiles/999/").status == 404


def test_interests_round_trip_through_the_set(site: Site):
    visitor = site.visitor()
    path = f"/profiles/{INTERESTED}/"
    assert _interests(visitor.get(path)) == ["cobol", "compilers", "navy"]  # loaded from rows

    added = visitor.submit(path, f"{path}interests/add/", name="Memcached")
    assert (added.status, added.headers["Location"]) == (302, path)
    assert _interests(visitor.get(path)) == ["cobol", "compilers", "memcached", "navy"]

    removed = visitor.submit(path, f"{path}interests/remove/", name="cobol")
    assert (removed.status, removed.headers["Location"]) == (302, path)
    assert _interests(visitor.get(path)) == ["compilers", "memcached", "navy"]

    refused = visitor.submit(path, f"{path}interests/add/", name="two words")
    assert refused.status == 200  # the page again, with the form's error
    assert "errorlist" in refused.body
    assert _interests(visitor.get(path)) == ["compilers", "memcached", "navy"]


def test_a_second_rebuild_is_refused_while_one_holds_the_lock(site: Site):
    first, second = site.visitor(), site.visitor()
    outcome: list[Response] = []
    running = threading.Thread(
        target=lambda: outcome.append(first.submit("/leaderboard/", "/leaderboard/rebuild/"))
    )
    running.start()
    try:
        deadline = time.monotonic() + 10
        while 'id="running"' not in second.get("/leaderboard/").body:
            assert time.monotonic() < deadline, "the first rebuild never showed as running"
            time.sleep(0.05)
        refused = second.submit("/leaderboard/", "/leaderboard/rebuild/")
    finally:
        running.join(timeout=30)
    assert refused.status == 409
    assert 'id="refused"' in refused.body

    assert [(r.status, r.headers["Location"]) for r in outcome] == [(302, "/leaderboard/")]
    board = second.get("/leaderboard/")
    assert 'id="running"' not in board.body
    assert board.text_of("built")
    # The owner released the lock: the next rebuild runs.
    assert second.submit("/leaderboard/", "/leaderboard/rebuild/").status == 302


def test_profile_saves_are_rate_limited(site: Site):
    visitor = site.visitor()
    edit = f"/profiles/{READ_ONLY}/edit/"
    # Invalid saves (no name) change nothing, but each is an attempt: 5 a minute.
    answers = [visitor.submit(edit, edit, name="", city="", bio="") for _ in range(6)]
    assert [a.status for a in answers] == [200] * 5 + [429]
    assert 1 <= int(answers[-1].headers["Retry-After"]) <= 66
    assert visitor.get(edit).status == 200  # reading the form is not limited


def test_every_page_shows_the_cached_member_count(site: Site):
    page = site.visitor().get(f"/profiles/{READ_ONLY}/")
    assert page.text_of("member-count") == "5"  # the seed migration's profiles


def test_the_members_sidebar_is_one_cached_fragment(site: Site):
    visitor = site.visitor()
    pages = [visitor.get(f"/profiles/{READ_ONLY}/"), visitor.get("/leaderboard/")]
    stamps = {page.text_of("directory-rendered") for page in pages}
    assert len(stamps) == 1  # rendered once, served to both pages from the cache
    assert all(">Chidi</a>" in _directory(page) for page in pages)
