"""Every pattern through a real twemproxy (nutcracker 0.5.0), as a user configures it.

nutcracker passes the text protocol's data commands only: it closes the
connection on a meta command, ``flush_all`` or ``stats``.  With
``OPTIONS["protocol"] = "text"`` every pattern must work through it anyway.

To add a pattern: add a test method to :class:`TestPatterns`; it runs once
through Django's backend and once through Flask's (``cache`` is either one,
configured with LOCATION the nutcracker address), on servers flushed behind the
proxy.  Django's decorators (``stampede_guard``, ``cached``) are in
:class:`TestDjangoDecorators`.  The session's nutcracker starts in well under a
second; the whole suite takes a few.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings

from django_mcpatterns.core.exceptions import CommandNotSupportedError, LockError
from django_mcpatterns.decorators import cached, stampede_guard
from tests.harness import MemcachedServer, Nutcracker, raw_client, server_ttl, servers_holding
from tests.twemproxy.frameworks import FRAMEWORKS, cache_through

TEXT = {"protocol": "text", "timeout": 5}


@pytest.fixture(params=FRAMEWORKS)
def cache(request: pytest.FixtureRequest, nutcracker: Nutcracker) -> Iterator[Any]:
    """A cache through nutcracker in text mode, as Django or Flask users configure it."""
    with cache_through(nutcracker, request.param, TEXT) as cache:
        yield cache


def holder(cache: Any, nutcracker: Nutcracker, key: str) -> tuple[MemcachedServer, str]:
    """The server behind the proxy that holds ``key``, and the key as stored."""
    made = cache._pattern_key(key)
    (spec,) = servers_holding(nutcracker.servers, made)
    return next(s for s in nutcracker.servers if s.spec == spec), made


def stored_size(cache: Any, nutcracker: Nutcracker, key: str) -> int:
    """The bytes memcached holds for ``key``, read from the server behind the proxy."""
    server, made = holder(cache, nutcracker, key)
    data = raw_client(server).get(made)
    return len(data)


def held_ttl(cache: Any, nutcracker: Nutcracker, key: str) -> int | None:
    """The TTL memcached holds for ``key``, read from the server behind the proxy."""
    return server_ttl(*holder(cache, nutcracker, key))


class TestPatterns:
    """The pattern suite through nutcracker: one method per pattern behaviour."""

    def test_plain_commands(self, cache: Any) -> None:
        assert cache.set("k", {"a": 1})
        assert cache.get("k") == {"a": 1}
        assert cache.add("k", 2) is False
        cache.set_many({"x": 1, "y": 2})  # Django returns the failed keys, Flask the stored
        assert (cache.get("x"), cache.get("y")) == (1, 2)
        assert cache.delete("k")
        assert cache.get("k") is None

    def test_sets_compact_and_keep_their_ttl(self, cache: Any, nutcracker: Nutcracker) -> None:
        cache.sadd("s", *range(1000), timeout=100)
        cache.srem("s", *range(950))
        dirty = stored_size(cache, nutcracker, "s")
        assert cache.smembers("s") == set(range(950, 1000))  # the read compacts the log
        assert stored_size(cache, nutcracker, "s") < dirty / 10
        assert 90 <= held_ttl(cache, nutcracker, "s") <= 100  # the rewrite kept the TTL
        assert cache.smembers("s") == set(range(950, 1000))
        assert cache.scard("s") == 50
        assert cache.sismember("s", 999)
        assert not cache.sismember("s", 1)
        assert cache.spop("s") in set(range(950, 1000))

    def test_lists(self, cache: Any) -> None:
        cache.rpush("l", "a", "b", "c", "b")
        assert cache.lrange("l", 0, -1) == ["a", "b", "c", "b"]
        assert cache.lrem("l", 0, "b") == 1  # the removal is recorded
        assert cache.llen("l") == 2
        assert cache.lrange("l", 0, -1) == ["a", "c"]

    def test_namespaces_nested_and_invalidated(self, cache: Any) -> None:
        users = cache.namespace("users", 7)
        posts = users.namespace("posts")
        users.set("name", "ann")
        posts.set("first", "hello")
        assert users.get("name") == "ann"
        assert posts.get("first") == "hello"
        posts.invalidate()
        assert posts.get("first") is None
        assert users.get("name") == "ann"
        posts.set("first", "again")
        cache.invalidate_namespace("users", 7)
        assert users.get("name") is None
        assert posts.get("first") is None
        assert users.get_or_set("name", "bob") == "bob"
        assert users.get("name") == "bob"

    def test_lock_acquire_extend_release(self, cache: Any) -> None:
        lock = cache.lock("job", timeout=10, blocking=False)
        assert lock.acquire()
        assert not cache.lock("job", timeout=10, blocking=False).acquire()
        lock.extend(20)
        lock.release()
        with pytest.raises(LockError):
            lock.release()
        assert cache.lock("job", timeout=10, blocking=False).acquire()

    def test_lock_excludes_threads(self, cache: Any) -> None:
        cache.set("counter", 0)

        def work() -> None:
            for _ in range(5):
                with cache.lock("counter-lock", timeout=10, blocking_timeout=20):
                    value = cache.get("counter")
                    time.sleep(0.001)
                    cache.set("counter", value + 1)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert cache.get("counter") == 20

    def test_get_or_compute_one_winner_among_threads(self, cache: Any) -> None:
        computed: list[int] = []
        start = threading.Barrier(5)
        results: list[Any] = []

        def compute() -> str:
            computed.append(1)
            time.sleep(0.3)
            return "fresh"

        def reader() -> None:
            start.wait()
            results.append(cache.get_or_compute("page", compute, 60))

        threads = [threading.Thread(target=reader) for _ in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == ["fresh"] * 5
        assert len(computed) == 1

    def test_stale_value_served_while_one_caller_recomputes(self, cache: Any) -> None:
        assert cache.get_or_compute("page", lambda: "old", 60) == "old"
        assert cache.mark_stale("page")
        recomputing, release = threading.Event(), threading.Event()

        def slow() -> str:
            recomputing.set()
            release.wait(10)
            return "new"

        winner: list[str] = []
        thread = threading.Thread(target=lambda: winner.append(cache.get_or_compute("page", slow)))
        thread.start()
        assert recomputing.wait(10)
        assert cache.get_or_compute("page", lambda: pytest.fail("a second recompute")) == "old"
        release.set()
        thread.join()
        assert winner == ["new"]
        assert cache.get_or_compute("page", lambda: "unused", 60) == "new"

    def test_counters(self, cache: Any) -> None:
        cache.set("n", 5)
        if hasattr(cache, "incr"):
            assert cache.incr("n", 2) == 7
            assert cache.decr("n") == 6
        else:
            assert cache.inc("n", 2) == 7
            assert cache.dec("n", 10) == -3  # below 0: a cas rewrite keeping the TTL

    def test_clear_is_refused_with_a_clear_error(self, cache: Any) -> None:

        with pytest.raises(CommandNotSupportedError, match="flush_all"):
            cache.clear()
        cache.set("k", 1)
        assert cache.get("k") == 1  # the refusal did not take the proxy out


# -- Django's decorators over the same proxy ---------------------------------------

renders: list[int] = []


@stampede_guard(60)
def page(request: HttpRequest) -> HttpResponse:
    renders.append(1)
    return HttpResponse(f"render #{len(renders)}")


@cached(60)
def square(n: int) -> int:
    renders.append(1)
    return n * n


@pytest.fixture
def django_through_proxy(nutcracker: Nutcracker) -> Iterator[None]:
    nutcracker.flush()
    renders.clear()
    backend = "django_mcpatterns.backend.KetamaMemcacheCache"
    setting = {"BACKEND": backend, "LOCATION": nutcracker.spec, "OPTIONS": dict(TEXT)}
    with override_settings(CACHES={"default": setting}):
        yield


@pytest.mark.usefixtures("django_through_proxy")
class TestDjangoDecorators:
    def test_stampede_guard_renders_once_and_marks_stale(self) -> None:
        request = RequestFactory().get("/page")
        assert page(request).content == b"render #1"
        assert page(RequestFactory().get("/page")).content == b"render #1"
        assert page.mark_stale(request)
        assert page(RequestFactory().get("/page")).content == b"render #2"
        assert len(renders) == 2

    def test_cached_computes_once_until_invalidated(self) -> None:
        assert (square(4), square(4)) == (16, 16)
        assert len(renders) == 1
        square.invalidate(4)
        assert square(4) == 16
        assert len(renders) == 2
