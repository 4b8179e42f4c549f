"""No thread hop on our async I/O paths: every async cache method runs on the event loop.

Django's default async cache API runs each sync method in a thread through
asgiref's ``sync_to_async``.  Here asgiref's ``SyncToAsync``, the loop's
``run_in_executor`` and ``asyncio.to_thread`` are made to fail, then every
async cache method and pattern runs on both backends.  The one hop allowed is
a user's plain-callable compute (it may use the ORM, which refuses to run on
the loop): it is let through, and counted.

Pattern groups that have not landed on this branch yet skip, naming what is
missing, rather than pass on nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib.util
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from asgiref.sync import SyncToAsync
from django.core.cache import caches

from tests.django.conftest import Deployment, DeploymentSuite


@dataclass
class Hops:
    """What tried to leave the loop: refused hops and the user's computes let through."""

    refused: list[str] = field(default_factory=list)
    allowed: list[Callable[..., Any]] = field(default_factory=list)
    user_code: set[Callable[..., Any]] = field(default_factory=set)

    def allow(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Mark ``function`` as the user's own compute: it may hop to a thread."""
        self.user_code.add(function)
        return function


_USER_HOP: contextvars.ContextVar[bool] = contextvars.ContextVar("user_hop", default=False)


@contextmanager
def threads_forbidden() -> Iterator[Hops]:
    """Make every way off the event loop fail (and record it), except the user's computes."""
    hops = Hops()
    original_call = SyncToAsync.__call__
    original_executor = asyncio.BaseEventLoop.run_in_executor
    original_to_thread = asyncio.to_thread

    async def guarded_call(self: SyncToAsync, *args: Any, **kwargs: Any) -> Any:  # type: ignore[type-arg]
        if self.func in hops.user_code:
            hops.allowed.append(self.func)
            token = _USER_HOP.set(True)  # asgiref's own executor call, for this task only
            try:
                return await original_call(self, *args, **kwargs)
            finally:
                _USER_HOP.reset(token)
        hops.refused.append(f"sync_to_async({self.func!r})")
        raise AssertionError(f"sync_to_async({self.func!r}) on an async I/O path")

    def refused_executor(self: Any, executor: Any, func: Any, *args: Any) -> Any:
        if _USER_HOP.get():
            return original_executor(self, executor, func, *args)
        hops.refused.append(f"run_in_executor({func!r})")
        raise AssertionError(f"run_in_executor({func!r}) on an async I/O path")

    async def refused_to_thread(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        hops.refused.append(f"to_thread({func!r})")
        raise AssertionError(f"asyncio.to_thread({func!r}) on an async I/O path")

    SyncToAsync.__call__ = guarded_call  # type: ignore[method-assign]
    asyncio.BaseEventLoop.run_in_executor = refused_executor  # type: ignore[method-assign]
    asyncio.to_thread = refused_to_thread
    try:
        yield hops
    finally:
        SyncToAsync.__call__ = original_call  # type: ignore[method-assign]
        asyncio.BaseEventLoop.run_in_executor = original_executor  # type: ignore[method-assign]
        asyncio.to_thread = original_to_thread


def require(target: Any, *names: str) -> None:
    missing = [name for name in names if not hasattr(target, name)]
    if missing:
        pytest.skip(f"not on this branch yet: {', '.join(missing)}")


# -- workloads: each calls every async method of one group ---------------------------


async def django_api(cache: Any, hops: Hops) -> None:
    assert await cache.aset("a", 1) is True
    assert await cache.aget("a") == 1
    assert await cache.aadd("b", 2) is True
    assert await cache.aset_many({"c": 3, "d": 4}) == []
    assert await cache.aget_many(["a", "b", "c", "d"]) == {"a": 1, "b": 2, "c": 3, "d": 4}
    assert await cache.aincr("a", 4) == 5
    assert await cache.adecr("a") == 4
    assert await cache.atouch("a", 60) is True
    assert await cache.ahas_key("a") is True
    assert await cache.aget_or_set("e", 5) == 5
    assert await cache.aget_or_set("f", hops.allow(lambda: 6)) == 6
    assert await cache.aincr_version("e") == 2
    assert await cache.adecr_version("e", version=2) == 1
    assert await cache.adelete("a") is True
    await cache.adelete_many(["b", "c"])
    assert await cache.aget_many(["a", "b", "c", "d"]) == {"d": 4}
    await cache.aclose()
    await cache.aclear()
    assert await cache.aget("d") is None


SET_METHODS = [
    "asadd",
    "asrem",
    "asmembers",
    "asismember",
    "asmismember",
    "ascard",
    "aspop",
    "asrandmember",
    "asmove",
    "asunion",
    "asinter",
    "asdiff",
    "asunionstore",
    "asinterstore",
    "asdiffstore",
]


async def sets(cache: Any, hops: Hops) -> None:
    require(cache, *SET_METHODS)
    assert await cache.asadd("s1", "a", "b", "c") == 3
    assert await cache.asadd("s2", "b", "c", "d") == 3
    assert await cache.asrem("s1", "c") == 1
    assert await cache.asmembers("s1") == {"a", "b"}
    assert await cache.asismember("s1", "a") is True
    assert await cache.asmismember("s1", "a", "z") == [True, False]
    assert await cache.ascard("s2") == 3
    assert await cache.asrandmember("s2") in {"b", "c", "d"}
    assert await cache.aspop("s2") in {"b", "c", "d"}
    assert await cache.asmove("s1", "s3", "a") is True
    assert await cache.asunion("s1", "s3") == {"a", "b"}
    assert await cache.asinter("s1", "s3") == set()
    assert await cache.asdiff("s1", "s3") == {"b"}
    assert await cache.asunionstore("u", "s1", "s3") == 2
    assert await cache.asinterstore("i", "s1", "s3") == 0
    assert await cache.asdiffstore("d", "s1", "s3") == 1


async def lists(cache: Any, hops: Hops) -> None:
    require(cache, "arpush", "alrange", "allen", "alrem")
    assert await cache.arpush("l", "a", "b", "a") == 3
    assert await cache.alrange("l", 0, -1) == ["a", "b", "a"]
    assert await cache.allen("l") == 3
    assert await cache.alrem("l", 0, "a") == 1
    assert await cache.alrange("l", 0, -1) == ["b"]


async def stampede(cache: Any, hops: Hops) -> None:
    require(cache, "aget_or_compute", "amark_stale")

    async def compute() -> str:
        return "computed"

    assert await cache.aget_or_compute("page", compute, 60) == "computed"
    assert await cache.aget_or_compute("page", compute, 60) == "computed"
    assert await cache.amark_stale("page") is True
    assert await cache.aget_or_compute("page", hops.allow(lambda: "again"), 60) in {
        "computed",
        "again",
    }
    assert await cache.aget_or_compute("orm", hops.allow(lambda: "plain"), 60) == "plain"


async def namespaces(cache: Any, hops: Hops) -> None:
    ns = cache.namespace("user", 42)
    require(ns, "aget", "aset", "aadd", "adelete", "aget_many", "aset_many")
    require(ns, "aget_or_set", "aget_or_compute", "ainvalidate")
    require(cache, "ainvalidate_namespace")
    assert await ns.aset("name", "ada") is True
    assert await ns.aget("name") == "ada"
    assert await ns.aadd("name", "bob") is False
    assert await ns.aset_many({"x": 1, "y": 2}) == []
    assert await ns.aget_many(["name", "x", "y"]) == {"name": "ada", "x": 1, "y": 2}
    assert await ns.adelete("x") is True
    assert await ns.aget_or_set("z", 3) == 3

    async def compute() -> int:
        return 4

    assert await ns.aget_or_compute("w", compute, 60) == 4
    await ns.ainvalidate()
    assert await ns.aget("name") is None
    await ns.aset("name", "ada")
    await cache.ainvalidate_namespace("user", 42)
    assert await ns.aget("name") is None


async def locks(cache: Any, hops: Hops) -> None:
    lock = cache.lock("job", timeout=10)
    require(lock, "aacquire", "arelease", "aextend", "alocked", "aowned", "__aenter__")
    async with cache.lock("job", timeout=10) as held:
        assert await held.aowned() is True
        assert await held.alocked() is True
        await held.aextend(5)  # raises LockNotOwnedError once lapsed
        other = cache.lock("job", timeout=10, blocking=False)
        assert await other.aacquire() is False
    assert await lock.aacquire() is True
    await lock.arelease()
    assert await lock.alocked() is False


async def decorators(cache: Any, hops: Hops) -> None:
    require(cache, "aget_or_compute")
    from django.test import RequestFactory

    from django_mcpatterns.decorators import cached, stampede_guard

    @cached(60)
    async def square(n: int) -> int:
        return n * n

    assert await square(3) == 9
    assert await square(3) == 9
    assert await square.ainvalidate(3) is True

    @stampede_guard(60)
    async def page(request: Any) -> Any:
        from django.http import HttpResponse

        return HttpResponse("hello")

    response = await page(RequestFactory().get("/hello"))
    assert response.content == b"hello"
    response = await page(RequestFactory().get("/hello"))
    assert response.content == b"hello"


WORKLOADS: dict[str, Callable[[Any, Hops], Awaitable[None]]] = {
    "django_api": django_api,
    "sets": sets,
    "lists": lists,
    "stampede": stampede,
    "namespaces": namespaces,
    "locks": locks,
    "decorators": decorators,
}


class NoThreadHop(DeploymentSuite):
    @pytest.fixture(autouse=True)
    def _async_store(self, deployment: Deployment) -> None:
        if (
            deployment.has_servers
            and importlib.util.find_spec("django_mcpatterns.core.aio") is None
        ):
            pytest.skip("the AsyncCluster (django_mcpatterns.core.aio) has not landed yet")

    @pytest.mark.parametrize("workload", list(WORKLOADS))
    def test_async_methods_stay_on_the_loop(self, workload: str) -> None:
        cache = caches["default"]
        with threads_forbidden() as hops:
            asyncio.run(WORKLOADS[workload](cache, hops))
        assert hops.refused == []
        # Only the user's plain callables went to a thread, once per call made.
        assert set(hops.allowed) <= hops.user_code

    def test_the_guard_catches_djangos_default_hop(self) -> None:
        """The guard works: Django's own BaseCache.aget (sync_to_async) is refused."""
        from django.core.cache.backends.base import BaseCache

        cache = caches["default"]
        with threads_forbidden() as hops, pytest.raises(AssertionError, match="sync_to_async"):
            asyncio.run(BaseCache.aget(cache, "a"))
        assert len(hops.refused) == 1

    def test_a_plain_compute_is_the_one_hop(self) -> None:
        cache = caches["default"]
        require(cache, "aget_or_compute")
        with threads_forbidden() as hops:
            compute = hops.allow(lambda: "from the ORM")
            assert asyncio.run(cache.aget_or_compute("k", compute, 60)) == "from the ORM"
        assert hops.allowed == [compute]
        assert hops.refused == []


class TestEmbedded(NoThreadHop):
    @pytest.fixture
    def deployment(self) -> Deployment:
        return Deployment.embedded("no-thread-hop")


class TestMemcached(NoThreadHop):
    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3)


class TestMemcachedText(NoThreadHop):
    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3, protocol="text")
