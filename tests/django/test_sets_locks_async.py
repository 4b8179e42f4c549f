"""The asyncio forms of sets, lists and locks on the Django backends (``await cache.asadd(...)``).

Reached the way an async view reaches them (``caches[...]`` built from
``settings.CACHES``), on the embedded store and on a 3-server cluster (once
the cluster backend has its asyncio store): Django's key rules, versions and
timeout conventions apply as in the sync forms, whose answers the async ones
must give.  The algorithms are proven in ``tests/core/patterns/_async/`` (both forms).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest
from django.core.cache import caches
from django.core.cache.backends.base import InvalidCacheKey

from django_mcpatterns import signals
from django_mcpatterns.core.exceptions import LockError, LockTimeoutError
from django_mcpatterns.core.locks import Lock
from tests.core.asyncio_tools import loop_never_blocks
from tests.django.conftest import Deployment, DeploymentSuite, received
from tests.django.test_sets import DJANGO_REDIS_SIGNATURES

T = TypeVar("T")


def run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await coroutine

    return asyncio.run(main())


def shape(method: Any) -> list[tuple[str, Any, Any]]:
    """Parameter names, kinds and defaults (annotations differ: loaders may be coroutines)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(method).parameters.values()]


class AsyncPatternsOnDjango(DeploymentSuite):
    """The contract; subclasses provide ``deployment``."""

    def caches_setting(self, deployment: Deployment) -> dict[str, dict[str, Any]]:
        return {
            "default": deployment.params(),
            "v2": deployment.params(VERSION=2),
            "prefix": deployment.params(KEY_PREFIX="other"),
        }

    @pytest.fixture(autouse=True)
    def _has_astore(self, cache: Any) -> None:
        try:
            cache.astore  # noqa: B018 - the cluster backend's arrives with AsyncCluster
        except NotImplementedError:
            pytest.skip("this backend has no asyncio store on this branch yet")

    # -- sets and lists --------------------------------------------------------

    @pytest.mark.parametrize("name", list(DJANGO_REDIS_SIGNATURES))
    def test_each_method_has_an_a_form_with_the_same_signature(self, cache: Any, name: str) -> None:
        sync, coroutine = getattr(cache, name), getattr(cache, f"a{name}")
        assert inspect.iscoroutinefunction(coroutine)
        assert shape(coroutine) == shape(sync)

    def test_async_scans_answer_as_the_sync_ones(self, cache: Any) -> None:
        async def scenario() -> tuple[set[Any], list[Any]]:
            await cache.asadd("s", "bar1", "bar2", "zoo")
            every = [member async for member in cache.asscan_iter("s", match="bar*")]
            return await cache.asscan("s", match="z*", count=1), sorted(every)

        assert run(scenario()) == ({"zoo"}, ["bar1", "bar2"])
        assert shape(cache.asscan_iter) == shape(cache.sscan_iter)
        assert inspect.isasyncgenfunction(cache.asscan_iter)

    def test_async_sets_answer_as_the_sync_ones(self, cache: Any) -> None:
        async def scenario() -> None:
            assert await cache.asadd("s", "a", "b", "c", 1) == 4
            assert await cache.asrem("s", "b") == 1
            assert await cache.asmembers("s") == {"a", "c", 1}
            assert await cache.asismember("s", "a") is True
            assert await cache.asmismember("s", "a", "b", 1) == [True, False, True]
            assert await cache.ascard("s") == 3
            assert await cache.asrandmember("s") in {"a", "c", 1}
            await cache.asadd("t", "c", "d")
            assert await cache.asunion("s", "t") == {"a", "c", "d", 1}
            assert await cache.asinter("s", "t") == {"c"}
            assert await cache.asdiff("s", "t") == {"a", 1}
            assert await cache.asunionstore("u", "s", "t") == 4
            assert await cache.asinterstore("i", "s", "t") == 1
            assert await cache.asdiffstore("d", "s", "t") == 2
            assert await cache.asmove("t", "m", "d") is True
            assert await cache.aspop("m") == "d"
            assert await cache.aspop("m") is None

        run(scenario())
        assert cache.smembers("s") == {"a", "c", 1}
        assert cache.smembers("u") == {"a", "c", "d", 1}
        assert cache.smembers("i") == {"c"}
        assert cache.smembers("d") == {"a", 1}
        assert cache.smembers("t") == {"c"}

    def test_versions_prefixes_and_key_rules_apply(self, cache: Any) -> None:
        async def scenario() -> None:
            await cache.asadd("s", "v1")
            await cache.asadd("s", "v2", version=2)
            await caches["prefix"].asadd("s", "prefixed")
            assert await caches["v2"].asmembers("s") == {"v2"}
            assert await cache.asdiffstore("d", "s", version_dest=3, version_keys=2) == 1
            with pytest.raises(InvalidCacheKey):
                await cache.asadd("with space", 1)

        run(scenario())
        assert cache.smembers("s") == {"v1"}
        assert cache.smembers("s", version=2) == {"v2"}
        assert caches["prefix"].smembers("s") == {"prefixed"}
        assert cache.smembers("d", version=3) == {"v2"}

    def test_async_lists(self, cache: Any) -> None:
        async def scenario() -> None:
            assert await cache.arpush("l", "a", "b", "a", 1) == 4
            assert await cache.alrem("l", 1, "a") == 1
            assert await cache.alrange("l", 0, -1) == ["b", "a", 1]
            assert await cache.allen("l") == 3
            assert await cache.alrem("missing", 0, "a") == 0

        run(scenario())
        assert cache.lrange("l", 0, -1) == ["b", "a", 1]

    def test_timeouts_follow_djangos_conventions(self, cache: Any) -> None:
        async def scenario() -> None:
            await cache.asadd("gone", 1, timeout=0)
            await cache.asadd("kept", 1, timeout=None)
            await cache.arpush("gone-list", 1, timeout=0)

        run(scenario())
        assert cache.smembers("gone") == set()
        assert cache.smembers("kept") == {1}
        assert cache.lrange("gone-list", 0, -1) == []

    def test_loaders_may_be_coroutines_or_orm_style_callables(self, cache: Any) -> None:
        threads: list[int] = []

        def orm_loader() -> set[str]:
            threads.append(threading.get_ident())
            return {"alice", "bob"}

        async def async_loader() -> set[str]:
            return {"carol"}

        async def scenario() -> None:
            assert await cache.asmembers("friends", loader=orm_loader) == {"alice", "bob"}
            assert await cache.ascard("friends", loader=orm_loader) == 2
            assert await cache.asmembers("others", loader=async_loader) == {"carol"}

        run(scenario())
        assert len(threads) == 1
        assert threads[0] != threading.get_ident()  # off the loop, as the ORM wants

    def test_fifty_tasks_adding_distinct_members_lose_none(self, cache: Any) -> None:
        async def writer(task: int) -> None:
            for i in range(5):
                await cache.asadd("shared", f"{task}:{i}")

        async def scenario() -> set[Any]:
            await asyncio.gather(*(writer(task) for task in range(50)))
            return await cache.asmembers("shared")

        expected = {f"{task}:{i}" for task in range(50) for i in range(5)}
        assert run(scenario()) == expected
        assert cache.smembers("shared") == expected

    def test_no_thread_hop_on_the_io_paths(
        self, cache: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Only a user's plain-callable loader may leave the loop."""
        from asgiref.sync import SyncToAsync

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("a thread hop on an I/O path")

        monkeypatch.setattr(SyncToAsync, "__call__", refuse)
        monkeypatch.setattr(asyncio.BaseEventLoop, "run_in_executor", refuse)
        monkeypatch.setattr(asyncio, "to_thread", refuse)

        async def loader() -> list[int]:
            return [7]

        async def scenario() -> None:
            await cache.asadd("s", *range(300))
            await cache.asrem("s", *range(100))
            assert await cache.ascard("s") == 200  # a read that compacts
            await cache.asadd("t", 1, 2)
            assert await cache.asinter("s", "t") == set()
            assert await cache.asunionstore("u", "s", "t") == 202
            assert await cache.aspop("t") in {1, 2}
            assert await cache.asmembers("lazy", loader=loader) == {7}
            await cache.arpush("l", 1, 2)
            await cache.alrem("l", 0, 1)
            assert await cache.alrange("l", 0, -1) == [2]
            async with cache.lock("job", timeout=5):
                assert await cache.lock("job", blocking_timeout=0.02).aacquire() is False
            with pytest.raises(AssertionError, match="thread hop"):
                await cache.asmembers("orm", loader=lambda: [1])  # the one allowed hop

        run(scenario())

    # -- locks -----------------------------------------------------------------

    def test_one_lock_object_has_both_forms(self, cache: Any) -> None:
        lock = cache.lock("job", timeout=5)
        assert isinstance(lock, Lock)
        for name in ("aacquire", "arelease", "aextend", "alocked", "aowned"):
            assert inspect.iscoroutinefunction(getattr(lock, name))
        assert not hasattr(cache, "alock")  # design.md: not a name

        async def scenario() -> None:
            async with cache.lock("job", timeout=5) as held:
                assert await held.aowned()
                assert await cache.lock("job").alocked()
                assert await cache.lock("job").aacquire(blocking=False) is False
                assert cache.lock("job").acquire(blocking=False) is False  # one item
            assert not await cache.lock("job").alocked()
            other = cache.lock("job", timeout=5)
            assert await other.aacquire()
            await other.aextend(5)
            with pytest.raises(LockError):
                other.release()  # the sync form has no owner here: it never acquired
            await other.arelease()

        run(scenario())
        assert not cache.lock("job").locked()

    def test_a_lock_uses_the_cache_key_rules(self, cache: Any) -> None:
        async def scenario() -> None:
            async with caches["prefix"].lock("job", timeout=5):
                assert await cache.lock("job").aacquire(blocking=False)  # another prefix
                assert await caches["prefix"].lock("job").alocked()

        run(scenario())

    def test_waiting_is_signalled_and_never_blocks_the_loop(self, cache: Any) -> None:
        async def holder() -> None:
            async with cache.lock("busy", timeout=30):
                await asyncio.sleep(0.2)

        async def waiter() -> None:
            await asyncio.sleep(0.02)
            async with cache.lock("busy", timeout=30, blocking_timeout=5):
                pass

        async def scenario() -> None:
            await asyncio.gather(holder(), waiter())

        with received(signals.lock_waited) as calls, loop_never_blocks():
            run(scenario())
        assert [call["key"] for call in calls] == [cache.make_key("busy")]
        with pytest.raises(LockTimeoutError):
            run(self._held_then_timed_out(cache))

    @staticmethod
    async def _held_then_timed_out(cache: Any) -> None:
        async with cache.lock("held", timeout=30), cache.lock("held", blocking_timeout=0.05):
            pass  # pragma: no cover

    def test_the_lock_decorates_coroutine_functions(self, cache: Any) -> None:
        inside: list[int] = []

        @cache.lock("decorated", timeout=5, blocking_timeout=5)
        async def job(n: int) -> int:
            inside.append(1)
            assert len(inside) == 1  # never two calls at once
            await asyncio.sleep(0.01)
            inside.pop()
            return n

        async def scenario() -> list[int]:
            return list(await asyncio.gather(*(job(n) for n in range(5))))

        assert run(scenario()) == [0, 1, 2, 3, 4]
        assert not cache.lock("decorated").locked()


class TestEmbedded(AsyncPatternsOnDjango):
    @pytest.fixture
    def deployment(self) -> Deployment:
        return Deployment.embedded(name="async-patterns")


class TestThreeServers(AsyncPatternsOnDjango):
    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3)


def test_async_requests_share_one_algorithm_object_per_store() -> None:
    """Django makes a backend per task in async code; the sets it reaches are one object."""
    from django.test import override_settings

    setting = {"default": Deployment.embedded(name="shared-patterns").params()}

    async def reach() -> tuple[int, int, Any]:
        cache = caches["default"]
        return id(cache), id(cache.binding.async_sets), cache.binding.async_sets

    async def scenario() -> list[tuple[int, int, Any]]:
        return list(await asyncio.gather(*(asyncio.create_task(reach()) for _ in range(5))))

    with override_settings(CACHES=setting):
        reached = run(scenario())
        assert len({backend for backend, _, _ in reached}) == 5  # a backend per task...
        assert len({sets for _, sets, _ in reached}) == 1  # ...one AsyncAppendSets
        elsewhere: list[Any] = []
        thread = threading.Thread(target=lambda: elsewhere.append(caches["default"].binding.sets))
        thread.start()
        thread.join()
        assert elsewhere[0] is caches["default"].binding.sets  # one per store, not per thread
