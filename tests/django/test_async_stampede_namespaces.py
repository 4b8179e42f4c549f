"""``await cache.aget_or_compute(...)`` and async namespaces on the Django backends.

The algorithms are proven in ``tests/core`` (test_stampede_async.py,
test_namespaces_async.py); here they are reached the way an async view reaches
them: ``caches[...]`` from ``settings.CACHES``, Django's key rules and timeout
conventions, signals, and the sync API reading what the async one wrote.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asgiref.sync
import pytest
from django.core.cache import caches

from django_mcpatterns import signals
from django_mcpatterns.patterns.namespaces import CacheNamespace
from tests.core.asyncio_tools import Computes, Ticker, loop_never_blocks, run
from tests.django.conftest import Deployment, DeploymentSuite, received


class AsyncStampedeNamespacesContract(DeploymentSuite):
    """Run against every deployment whose backend has an ``astore``."""

    def caches_setting(self, deployment: Deployment) -> dict[str, dict[str, Any]]:
        return {
            "default": deployment.params(),
            "prefixed": deployment.params(KEY_PREFIX="site2", VERSION=3),
        }

    # -- aget_or_compute --

    def test_50_tasks_compute_once_and_the_signal_is_sent(self, cache: Any) -> None:
        async def scenario() -> list[Any]:
            async with Ticker() as ticker:
                # The compute ends after 50 turns of another task: the loop ran all along.
                compute = Computes({"total": 42}, until=lambda: ticker.reached(50))
                values = await asyncio.gather(
                    *(cache.aget_or_compute("report", compute, 60) for _ in range(50))
                )
            assert compute.calls == 1
            return values

        with received(signals.recomputed) as recomputed, loop_never_blocks():
            values = run(scenario)
        assert values == [{"total": 42}] * 50
        assert [call["key"] for call in recomputed] == [cache.make_key("report")]
        assert cache.get("report") == {"total": 42}  # a plain read sees the value

    def test_key_rules_and_timeouts_are_the_sync_ones(self, cache: Any) -> None:
        prefixed = caches["prefixed"]

        async def scenario() -> tuple[Any, ...]:
            value = await prefixed.aget_or_compute("k", Computes("v"), 60)
            not_stored = await cache.aget_or_compute("zero", Computes("z"), 0)
            forever = await cache.aget_or_compute_result("forever", lambda: "f", None)
            return value, not_stored, forever

        value, not_stored, forever = run(scenario)
        assert value == "v"
        assert prefixed.get("k") == "v"
        assert cache.get("k") is None  # another prefix and version: another key
        assert prefixed.get_or_compute("k", lambda: "not this", 60) == "v"
        assert not_stored == "z"
        assert cache.get("zero") is None  # timeout 0: computed, not stored
        assert forever.value == "f"
        assert forever.envelope is not None
        assert forever.envelope.soft_expiry == float("inf")

    def test_amark_stale_serves_the_old_value_while_one_task_recomputes(self, cache: Any) -> None:
        cache.get_or_compute("page", lambda: "old", 60)
        fresh = Computes("new", seconds=0.05)

        async def scenario() -> tuple[bool, list[Any], bool]:
            marked = await cache.amark_stale("page")
            values = await asyncio.gather(
                *(cache.aget_or_compute("page", fresh, 60) for _ in range(10))
            )
            return marked, values, await cache.amark_stale("missing")

        with received(signals.stale_served) as stale:
            marked, values, missing = run(scenario)
        assert marked is True
        assert missing is False
        assert sorted(values) == ["new"] + ["old"] * 9
        assert fresh.calls == 1
        assert len(stale) == 9

    def test_aget_or_set_and_arecompute(self, cache: Any) -> None:
        async def scenario() -> tuple[Any, ...]:
            first = await cache.aget_or_set("conf", Computes("computed"), 60)
            second = await cache.aget_or_set("conf", lambda: "ignored", 60)
            recomputed = await cache.arecompute("conf2", Computes("now"), 60)
            envelope = await cache.aget_envelope("conf2")
            return first, second, recomputed, envelope

        first, second, recomputed, envelope = run(scenario)
        assert (first, second, recomputed) == ("computed", "computed", "now")
        assert cache.get("conf") == "computed"
        assert envelope is not None
        assert envelope.value == "now"

    def test_no_thread_hop_on_our_paths(self, cache: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        """With coroutine computes, nothing reaches sync_to_async, to_thread or an executor."""

        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("a thread hop on an async path")

        monkeypatch.setattr(asgiref.sync.SyncToAsync, "__init__", refuse)
        monkeypatch.setattr(asyncio, "to_thread", refuse)
        monkeypatch.setattr(asyncio.BaseEventLoop, "run_in_executor", refuse)
        cache.get_or_compute("stale", lambda: "old", 60)

        async def scenario() -> list[Any]:
            ns = cache.namespace("hop", soft=True)
            await ns.aset("k", 1)
            return [
                await cache.aget_or_compute("cold", Computes("v"), 60),
                await cache.aget_or_compute("cold", Computes("not this"), 60),
                await cache.amark_stale("stale"),
                await cache.aget_or_compute("stale", Computes("new"), 60),
                await cache.aget_or_set("set", Computes("s"), 60),
                await ns.aget_or_compute("c", Computes("c"), 60),
                await ns.aget_many(["k", "c"]),
                await ns.ainvalidate() > 0,
                await ns.aget_or_compute("c", Computes("again"), 60),  # stale: this one recomputes
            ]

        assert run(scenario) == ["v", "v", True, "new", "s", "c", {"k": 1, "c": "c"}, True, "again"]

    # -- namespaces --

    def test_namespace_a_methods(self, cache: Any) -> None:
        ns = cache.namespace("user", 42)
        assert isinstance(ns, CacheNamespace)
        ns.set("name", "ada")

        async def scenario() -> dict[str, Any]:
            got: dict[str, Any] = {"get": await ns.aget("name")}
            got["add"] = await ns.aadd("name", "bob")
            got["set"] = await ns.aset("city", "London")
            got["set_many"] = await ns.aset_many({"a": 1, "b": 2})
            got["get_many"] = await ns.aget_many(["name", "city", "a", "b", "none"])
            got["delete"] = await ns.adelete("a")
            await ns.adelete_many(["b"])
            got["get_or_set"] = await ns.aget_or_set("c", lambda: 3)
            got["get_or_compute"] = await ns.aget_or_compute("d", Computes(4), 60)
            got["recompute"] = await ns.arecompute("d", Computes(5), 60)
            got["nested"] = await ns.namespace("posts").aget_or_compute("p", Computes("p"), 60)
            return got

        got = run(scenario)
        assert got == {
            "get": "ada",
            "add": False,
            "set": True,
            "set_many": [],
            "get_many": {"name": "ada", "city": "London", "a": 1, "b": 2},
            "delete": True,
            "get_or_set": 3,
            "get_or_compute": 4,
            "recompute": 5,
            "nested": "p",
        }
        # The sync namespace reads what the async one wrote, by the cache's key rules.
        assert cache.namespace("user", 42).get_many(["city", "a", "c"]) == {
            "city": "London",
            "c": 3,
        }
        assert cache.namespace("user", 42).get_or_compute("d", lambda: 0, 60) == 5

    def test_ainvalidate_and_ainvalidate_namespace(self, cache: Any) -> None:
        ns = cache.namespace("org", 1)
        ns.set("k", "v")
        ns.namespace("team", 2).set("k", "inner")

        async def scenario() -> tuple[Any, ...]:
            first = await ns.ainvalidate()
            after_outer = await ns.aget("k"), await ns.namespace("team", 2).aget("k")
            await ns.aset("k", "v2")
            await ns.ainvalidate_namespace("team", 2)
            second = await cache.ainvalidate_namespace("org", 1)
            return first, after_outer, second, await ns.aget("k"), await ns.aversions()

        first, after_outer, second, last, versions = run(scenario)
        assert after_outer == (None, None)
        assert second == first + 1
        assert last is None
        assert versions == (second,)
        assert ns.get("k") is None

    def test_a_soft_namespace_serves_stale_in_async(self, cache: Any) -> None:
        ns = cache.namespace("page", soft=True)
        ns.get_or_compute("home", lambda: "old", 60)
        cache.invalidate_namespace("page")
        fresh = Computes("new", seconds=0.05)

        async def scenario() -> list[Any]:
            return await asyncio.gather(*(ns.aget_or_compute("home", fresh, 60) for _ in range(10)))

        assert sorted(run(scenario)) == ["new"] + ["old"] * 9
        assert fresh.calls == 1


class TestEmbedded(AsyncStampedeNamespacesContract):
    @pytest.fixture
    def deployment(self) -> Deployment:
        return Deployment.embedded("async-stampede")


class TestThreeServers(AsyncStampedeNamespacesContract):
    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3)


class TestThreeServersText(AsyncStampedeNamespacesContract):
    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3, protocol="text")
