"""``stampede_guard``: Flask views cached with soft expiry, through Flask's test client.

The stampede itself (one recomputing winner, waiting on a cold miss) is proven
in ``tests/core``; here a competing worker is simulated deterministically by
holding the page's recompute lock, as another process would.
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from flask import Flask, Response, make_response, request
from flask_caching import Cache

from django_mcpatterns.core.exceptions import ConfigurationError
from django_mcpatterns.core.stampede import StampedePolicy
from django_mcpatterns.flask import CachedPage, stampede_guard
from django_mcpatterns.patterns.namespaces import namespace_parts
from tests.flask.conftest import PREFIX, FlaskDeployment, deployments
from tests.harness import COMMAND_COUNTERS, server_counters
from tests.recompute import hold_recompute

deployment = deployments("cluster3", "embedded")


@pytest.fixture
def app_cache(deployment: FlaskDeployment) -> tuple[Flask, Cache]:
    return deployment.make_app(CACHE_DEFAULT_TIMEOUT=60)


@pytest.fixture
def calls() -> list[str]:
    return []


@pytest.fixture
def client(app_cache: tuple[Flask, Cache], calls: list[str]) -> Iterator[Any]:
    """A test client for an app with a few guarded views that count their runs."""
    app, cache = app_cache

    @app.route("/report/<int:n>", methods=["GET", "POST"])
    @stampede_guard(cache, timeout=60)
    def report(n: int) -> Any:
        calls.append(f"report {n}")
        return {"n": n, "run": len(calls)}

    @app.route("/search")
    @stampede_guard(cache, query_string=True)
    def search() -> str:
        calls.append("search")
        return f"{request.args.get('q')} #{len(calls)}"

    @app.route("/missing")
    @stampede_guard(cache)
    def missing() -> Any:
        calls.append("missing")
        return "not here", 404

    @app.route("/cookie")
    @stampede_guard(cache)
    def cookie() -> Response:
        calls.append("cookie")
        response = make_response("hello")
        response.set_cookie("visitor", "ann")
        return response

    @app.route("/forever")
    @stampede_guard(cache, timeout=0)
    def forever() -> str:
        calls.append("forever")
        return "kept"

    @app.route("/with space")
    @stampede_guard(cache)
    def spaced() -> str:
        calls.append("spaced")
        return "spaced"

    with app.test_client() as test_client:
        yield test_client


def test_a_page_is_rendered_once(client: Any, calls: list[str]) -> None:
    first = client.get("/report/1")
    second = client.get("/report/1")
    assert first.status_code == second.status_code == 200
    assert first.json == second.json == {"n": 1, "run": 1}
    assert second.headers["Content-Type"] == "application/json"
    assert client.get("/report/2").json == {"n": 2, "run": 2}
    assert calls == ["report 1", "report 2"]


def test_head_is_served_from_the_cache(client: Any, calls: list[str]) -> None:
    client.get("/report/1")
    head = client.head("/report/1")
    assert head.status_code == 200
    assert head.data == b""
    assert calls == ["report 1"]


def test_other_methods_are_not_cached(client: Any, calls: list[str]) -> None:
    client.post("/report/1")
    client.post("/report/1")
    assert calls == ["report 1", "report 1"]


def test_query_string_is_part_of_the_key(client: Any, calls: list[str]) -> None:
    assert client.get("/search?q=a&page=2").text == "a #1"
    assert client.get("/search?page=2&q=a").text == "a #1"
    assert client.get("/search?q=b").text == "b #2"


def test_uncacheable_responses_are_not_stored(client: Any, calls: list[str]) -> None:
    for _ in range(2):
        assert client.get("/missing").status_code == 404
        assert client.get("/cookie").headers["Set-Cookie"].startswith("visitor=ann")
    assert calls == ["missing", "cookie", "missing", "cookie"]


def test_an_invalid_key_renders_every_time(client: Any, calls: list[str]) -> None:
    assert client.get("/with space").text == "spaced"
    assert client.get("/with space").text == "spaced"
    assert calls == ["spaced", "spaced"]


def test_timeouts_follow_flask_caching(
    client: Any, app_cache: tuple[Flask, Cache], deployment: FlaskDeployment
) -> None:
    app, cache = app_cache
    client.get("/forever")
    client.get("/report/1")
    with app.app_context():
        assert cache.cache.get_envelope("view//forever").soft_expiry == math.inf
        report = cache.cache.get_envelope("view//report/1")
        assert report.hard_expiry - report.soft_expiry == pytest.approx(60)  # grace: the timeout
    if deployment.has_servers:
        assert deployment.ttl(PREFIX + "view//forever") == -1


def test_a_stale_page_is_served_while_another_worker_recomputes(
    client: Any, app_cache: tuple[Flask, Cache], calls: list[str]
) -> None:
    app, cache = app_cache
    client.get("/report/1")
    report = app.view_functions["report"]
    with app.app_context():
        assert report.mark_stale("/report/1")
        # Another worker won the recompute lock and is rendering the page.
        hold_recompute(cache.cache.store, PREFIX + report.key("/report/1"))
    assert client.get("/report/1").json == {"n": 1, "run": 1}  # stale, at once
    assert calls == ["report 1"]


def test_mark_stale_recomputes_once_and_invalidate_deletes(
    client: Any, app_cache: tuple[Flask, Cache], calls: list[str]
) -> None:
    app, _ = app_cache
    client.get("/report/1")
    report = app.view_functions["report"]
    assert report.original.__name__ == "report"
    with app.app_context():
        assert report.mark_stale("/report/1") is True
    assert client.get("/report/1").json["run"] == 2
    assert client.get("/report/1").json["run"] == 2
    with app.app_context():
        assert report.invalidate("/report/1") is True
        assert report.invalidate("/report/1") is False
    assert client.get("/report/1").json["run"] == 3


def test_concurrent_cold_requests_render_once(
    app_cache: tuple[Flask, Cache], deployment: FlaskDeployment
) -> None:
    app, cache = app_cache
    started: list[int] = []

    @app.route("/slow")
    @stampede_guard(cache, policy=StampedePolicy(wait=5))
    def slow() -> str:
        started.append(1)
        time.sleep(0.3)
        return "slow page"

    def fetch(_: int) -> str:
        with app.test_client() as own:
            return own.get("/slow").text

    with ThreadPoolExecutor(4) as pool:
        pages = list(pool.map(fetch, range(4)))
    assert pages == ["slow page"] * 4
    assert started == [1]


def test_a_policy_with_a_runner_is_refused(app_cache: tuple[Flask, Cache]) -> None:
    _, cache = app_cache
    with pytest.raises(ConfigurationError, match="runner"):
        stampede_guard(cache, policy=StampedePolicy(runner=lambda job: None))


def test_cached_page_round_trip() -> None:
    response = Response(b"body", status=201, headers={"X-Answer": "42"})
    page = CachedPage.of(response)
    again = page.response()
    assert (again.status_code, again.get_data(), again.headers["X-Answer"]) == (201, b"body", "42")


# -- namespaces ---------------------------------------------------------------------


def user_namespace(user: int, **_: Any) -> tuple[str, int]:
    return ("user", user)


def register_namespaced(
    app: Flask,
    cache: Cache,
    calls: list[str],
    *,
    delay: float = 0.0,
    policy: StampedePolicy | None = None,
) -> None:
    """Namespaced views: a user's items (a namespace per user, query variants) and a catalog."""

    @app.route("/users/<int:user>/items/<item>", methods=["GET", "POST"])
    @stampede_guard(cache, timeout=60, query_string=True, namespace=user_namespace, policy=policy)
    def user_item(user: int, item: str) -> str:
        calls.append(f"{user}/{item}")
        time.sleep(delay)
        return f"{user}/{item}?{request.args.get('v')} #{len(calls)}"

    @app.route("/catalog/<name>")
    @stampede_guard(cache, timeout=60, namespace="catalog")
    def catalog(name: str) -> str:
        calls.append(f"catalog {name}")
        return f"{name} #{len(calls)}"


@pytest.fixture
def namespaced(app_cache: tuple[Flask, Cache], calls: list[str]) -> Iterator[Any]:
    app, cache = app_cache
    register_namespaced(app, cache, calls)
    with app.test_client() as test_client:
        yield test_client


def test_namespace_arguments_name_the_namespaces_djangos_cached_names() -> None:
    assert namespace_parts(("user", 42)) == namespace_parts(["user", 42]) == ("user", 42)
    assert namespace_parts("catalog") == ("catalog",)
    assert namespace_parts(7) == (7,)
    assert namespace_parts(user_namespace, user=42, item="a") == ("user", 42)
    assert namespace_parts(lambda user, **_: user, user=42) == (42,)


def test_namespaced_pages_are_cached_in_their_namespace(
    namespaced: Any, app_cache: tuple[Flask, Cache], calls: list[str]
) -> None:
    app, cache = app_cache
    assert namespaced.get("/users/1/items/a").text == "1/a?None #1"
    assert namespaced.get("/users/1/items/a").text == "1/a?None #1"
    assert namespaced.get("/users/1/items/a?v=2").text == "1/a?2 #2"  # a variant of its own
    assert namespaced.get("/users/2/items/a").text == "2/a?None #3"
    assert namespaced.head("/users/2/items/a").status_code == 200
    assert namespaced.get("/catalog/shoes").text == namespaced.get("/catalog/shoes").text
    assert len(calls) == 4
    user_item = app.view_functions["user_item"]
    with app.app_context():
        local = user_item.key("/users/1/items/a")
        page = cache.cache.namespace("user", 1).get(local)
        assert isinstance(page, CachedPage)
        assert page.body == b"1/a?None #1"
        assert cache.cache.get(local) is None  # not a plain key
        made = cache.cache.namespace("user", 1)._ns.key(local)
        assert made.key.startswith((PREFIX + "ns:user:1|").encode())


def test_invalidate_namespace_drops_every_variant_of_that_namespace_only(
    namespaced: Any, app_cache: tuple[Flask, Cache], calls: list[str]
) -> None:
    app, _ = app_cache
    urls = ["/users/1/items/a", "/users/1/items/a?v=2", "/users/1/items/b", "/users/2/items/a"]
    first = [namespaced.get(url).text for url in urls]
    user_item = app.view_functions["user_item"]
    with app.app_context():
        assert isinstance(user_item.invalidate_namespace(user=1), int)
    again = [namespaced.get(url).text for url in urls]
    assert again[3] == first[3]  # user 2's page is untouched
    assert [text.split("#")[1] for text in again[:3]] == ["5", "6", "7"]
    assert [namespaced.get(url).text for url in urls] == again  # cached again
    assert len(calls) == 7


def test_the_cache_invalidates_the_namespace_too(
    namespaced: Any, app_cache: tuple[Flask, Cache], calls: list[str]
) -> None:
    app, cache = app_cache
    namespaced.get("/users/1/items/a")
    namespaced.get("/catalog/shoes")
    with app.app_context():
        cache.cache.invalidate_namespace("user", 1)
        cache.cache.namespace("catalog").invalidate()
    assert namespaced.get("/users/1/items/a").text == "1/a?None #3"
    assert namespaced.get("/catalog/shoes").text == "shoes #4"
    with app.app_context():
        app.view_functions["catalog"].invalidate_namespace()  # a fixed namespace: no arguments
    assert namespaced.get("/catalog/shoes").text == "shoes #5"


def test_invalidate_deletes_one_page_of_the_namespace(
    namespaced: Any, app_cache: tuple[Flask, Cache], calls: list[str]
) -> None:
    app, cache = app_cache
    namespaced.get("/users/1/items/a")
    namespaced.get("/users/1/items/a?v=2")
    user_item = app.view_functions["user_item"]
    with app.app_context():
        assert user_item.invalidate("/users/1/items/a", {"v": "2"}, user=1) is True
        assert user_item.invalidate("/users/1/items/a", {"v": "2"}, user=1) is False
    assert namespaced.get("/users/1/items/a").text == "1/a?None #1"
    assert namespaced.get("/users/1/items/a?v=2").text == "1/a?2 #3"
    # A namespaced page is dropped with its namespace, never marked stale.
    assert not hasattr(user_item, "mark_stale")
    assert not hasattr(stampede_guard(cache)(str), "invalidate_namespace")


def test_namespaced_views_pass_other_methods_and_invalid_keys_through(
    namespaced: Any, calls: list[str]
) -> None:
    namespaced.post("/users/1/items/a")
    namespaced.post("/users/1/items/a")
    namespaced.get("/users/1/items/with space")
    namespaced.get("/users/1/items/with space")
    assert calls == ["1/a", "1/a", "1/with space", "1/with space"]


# An embedded cache belongs to its app; apps share (and memcached counts) only on servers.
on_servers = pytest.mark.parametrize("deployment", ["cluster3"], indirect=True)


@on_servers
def test_another_app_instance_invalidates_the_namespace(
    app_cache: tuple[Flask, Cache], deployment: FlaskDeployment, calls: list[str]
) -> None:
    app, cache = app_cache
    # Another worker: its own app, its own cluster client (other options: not shared).
    other, other_cache = deployment.make_app(
        CACHE_DEFAULT_TIMEOUT=60, CACHE_OPTIONS={"max_pool_size": 3}
    )
    for each, its_cache in ((app, cache), (other, other_cache)):
        register_namespaced(each, its_cache, calls)
    with app.app_context():
        store = cache.cache.store
    with other.app_context():
        assert other_cache.cache.store is not store
    here, elsewhere = app.test_client(), other.test_client()
    assert here.get("/users/1/items/a").text == "1/a?None #1"
    assert elsewhere.get("/users/1/items/a").text == "1/a?None #1"  # one shared page
    with other.app_context():
        other.view_functions["user_item"].invalidate_namespace(user=1)
    assert here.get("/users/1/items/a").text == "1/a?None #2"
    assert elsewhere.get("/users/1/items/a").text == "1/a?None #2"
    with other.app_context():
        other_cache.cache.invalidate_namespace("user", 1)
    assert here.get("/users/1/items/a").text == "1/a?None #3"


class SendCounter:
    """A ``socket`` module for pymemcache (``socket_module``) that counts the requests sent."""

    def __init__(self) -> None:
        self.sends = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(socket, name)

    def socket(self, *args: Any) -> Any:
        counter = self
        sock = socket.socket(*args)

        class Counted:
            def __getattr__(self, name: str) -> Any:
                return getattr(sock, name)

            def sendall(self, data: bytes) -> None:
                counter.sends += 1
                sock.sendall(data)

            def send(self, data: bytes) -> int:
                counter.sends += 1
                return sock.send(data)

        return Counted()


@on_servers
def test_a_fresh_namespaced_page_is_one_request(deployment: FlaskDeployment) -> None:
    spy = SendCounter()
    app, cache = deployment.make_app(CACHE_DEFAULT_TIMEOUT=60, CACHE_OPTIONS={"socket_module": spy})
    calls: list[str] = []
    register_namespaced(app, cache, calls)
    servers = deployment.servers
    client = app.test_client()

    def requests(act: Callable[[], object]) -> tuple[int, list[Counter[str]]]:
        """The requests ``act`` sends, and what each server counted (the ones that moved)."""
        before = [server_counters([s], COMMAND_COUNTERS) for s in servers]
        sends = spy.sends
        act()
        after = [server_counters([s], COMMAND_COUNTERS) for s in servers]
        moved = [+(a - b) for a, b in zip(after, before, strict=True)]
        return spy.sends - sends, [m for m in moved if m]

    def get() -> None:
        assert client.get("/users/1/items/a?v=2").status_code == 200

    def invalidate() -> None:
        with app.app_context():
            app.view_functions["user_item"].invalidate_namespace(user=1)

    # Cold: read, create the version key, lock, the lease (add + gets), the fill (cas),
    # release (gets + cas).
    assert requests(get)[0] == 8
    # Fresh: one multi-get to one server of the namespace's version key and the page.
    assert requests(get) == (1, [Counter(cmd_get=2)])
    assert requests(invalidate) == (1, [Counter(incr_hits=1)])
    # Invalidated: the version key exists already; the lease's add is refused (the old
    # page is there), its gets leases the old page's cas.
    assert requests(get)[0] == 7
    assert calls == ["1/a", "1/a"]


def run_together(app: Flask, url: str, n: int = 4) -> list[str]:
    def fetch(_: int) -> str:
        with app.test_client() as own:
            return own.get(url).text

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(fetch, range(n)))


def test_an_invalidated_namespace_is_rendered_once_for_concurrent_requests(
    app_cache: tuple[Flask, Cache], calls: list[str]
) -> None:
    app, cache = app_cache
    register_namespaced(app, cache, calls, delay=0.3, policy=StampedePolicy(wait=5))
    url = "/users/1/items/a"
    assert run_together(app, url) == ["1/a?None #1"] * 4
    with app.app_context():
        cache.cache.invalidate_namespace("user", 1)
    assert run_together(app, url) == ["1/a?None #2"] * 4  # the others waited for it
    assert calls == ["1/a", "1/a"]


def test_a_stale_namespaced_page_is_recomputed_once_while_others_get_it(
    app_cache: tuple[Flask, Cache], calls: list[str]
) -> None:
    app, cache = app_cache

    @app.route("/users/<int:user>/feed")
    @stampede_guard(cache, timeout=1, namespace=user_namespace, policy=StampedePolicy(grace=60))
    def feed(user: int) -> str:
        calls.append(f"feed {user}")
        time.sleep(0.3)
        return f"feed #{len(calls)}"

    assert run_together(app, "/users/1/feed") == ["feed #1"] * 4
    time.sleep(1.1)  # stale now, still servable for the grace period
    pages = run_together(app, "/users/1/feed")
    assert sorted(pages) == ["feed #1"] * 3 + ["feed #2"]
    assert calls == ["feed 1", "feed 1"]


# -- async views (Flask 2+: run through app.ensure_sync, as Flask-Caching does) --------


def test_an_async_view_is_guarded_like_a_sync_one(app_cache: tuple[Flask, Cache]) -> None:
    app, cache = app_cache
    runs: list[int] = []

    @app.route("/async/<int:n>", methods=["GET", "POST"])
    @stampede_guard(cache, timeout=60)
    async def page(n: int) -> Any:
        runs.append(n)
        await asyncio.sleep(0)  # really a coroutine, run on Flask's loop for the request
        return {"n": n, "run": len(runs)}

    with app.test_client() as client:
        assert client.get("/async/1").json == {"n": 1, "run": 1}
        assert client.get("/async/1").json == {"n": 1, "run": 1}  # the cached page
        assert client.head("/async/1").status_code == 200
        assert client.post("/async/1").json == {"n": 1, "run": 2}  # not cached
        assert runs == [1, 1]
    with app.app_context():
        assert page.invalidate("/async/1") is True


def test_concurrent_cold_requests_render_an_async_view_once(
    app_cache: tuple[Flask, Cache],
) -> None:
    app, cache = app_cache
    started: list[int] = []

    @app.route("/async-slow")
    @stampede_guard(cache, policy=StampedePolicy(wait=5))
    async def slow() -> str:
        started.append(1)
        await asyncio.sleep(0.3)
        return "slow page"

    def fetch(_: int) -> str:
        with app.test_client() as own:
            return own.get("/async-slow").text

    with ThreadPoolExecutor(4) as pool:
        pages = list(pool.map(fetch, range(4)))
    assert pages == ["slow page"] * 4
    assert started == [1]


def test_pattern_async_forms_work_inside_an_async_view(app_cache: tuple[Flask, Cache]) -> None:
    """``await cache.cache.aget_or_compute(...)`` in an async view, on Flask's per-request loop."""
    app, cache = app_cache
    if not hasattr(cache.cache, "aget_or_compute"):
        pytest.skip("aget_or_compute (convstamp) is not on this branch yet")
    computed: list[int] = []

    async def compute() -> str:
        computed.append(1)
        return "value"

    @app.route("/async-patterns")
    async def view() -> str:
        return str(await cache.cache.aget_or_compute("async-key", compute, 60))

    with app.test_client() as client:
        assert client.get("/async-patterns").text == "value"
        assert client.get("/async-patterns").text == "value"
    assert computed == [1]
