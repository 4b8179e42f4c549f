"""Django's async cache API: every ``a``-method answers exactly as its sync one.

One scenario of calls (keys, versions, timeouts, invalid keys, oversized
values, counters, misses) runs twice on freshly cleared caches: through the
sync methods, then through their ``a``-prefixed forms.  The answers (values,
or the exception's type and message) and what the cache holds after each
call must be the same.  Then the async forms are shown to be native: they run
with threads forbidden (see also ``test_async_no_thread_hop.py``), and
``aget_many`` is one call to the store.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import random
from collections.abc import Callable
from typing import Any

import pytest
from django.core.cache import caches

from tests.django.conftest import Deployment, DeploymentSuite
from tests.django.test_backend_contract import OVERSIZED, Point

Call = tuple[str, tuple[Any, ...], dict[str, Any]]

#: Keys the scenario touches, read after every call to compare the caches' contents.
WATCHED = ["a", "b", "c", "d", "n", "s", "t", "u", 1, 2.5]

SCENARIO: list[Call] = [
    ("get", ("a",), {}),
    ("get", ("a", "fallback"), {}),
    ("set", ("a", 1), {}),
    ("get", ("a",), {}),
    ("set", ("a", None), {}),
    ("get", ("a", "fallback"), {}),
    ("set", ("b", Point(1, 2)), {"timeout": None}),
    ("get", ("b",), {}),
    ("set", ("c", "gone"), {"timeout": 0}),
    ("get", ("c",), {}),
    ("set", ("c", "gone"), {"timeout": -5}),
    ("set", ("c", "long"), {"timeout": 60 * 60 * 24 * 31}),
    ("get", ("c",), {}),
    ("set", ("c", "float"), {"timeout": 100.5}),
    ("add", ("a", 2), {}),
    ("add", ("d", 2), {}),
    ("add", ("d", 3), {}),
    ("add", ("u", OVERSIZED), {}),
    ("get", ("u",), {}),
    ("set", ("u", "small"), {}),
    ("set", ("u", OVERSIZED), {}),  # False, and the old value is gone
    ("get", ("u", "fallback"), {}),
    ("set", (1, "int key"), {}),
    ("set", (2.5, "tuple key"), {}),
    ("get_many", (["a", "b", "d", "missing", 1, 2.5],), {}),
    ("get_many", ([],), {}),
    ("set_many", ({"s": 1, "t": 2},), {}),
    ("set_many", ({"s": 3, "u": OVERSIZED},), {}),
    ("set_many", ({"s": 4},), {"timeout": 0}),
    ("get_many", (["s", "t", "u"],), {}),
    ("set", ("n", 10), {}),
    ("incr", ("n",), {}),
    ("incr", ("n", 5), {}),
    ("incr", ("n", -3), {}),
    ("decr", ("n",), {}),
    ("decr", ("n", 4), {}),
    ("decr", ("n", -2), {}),
    ("decr", ("n", 100), {}),  # memcached stops at 0
    ("incr", ("missing",), {}),
    ("decr", ("missing",), {}),
    ("incr", ("b",), {}),  # not a number
    ("has_key", ("n",), {}),
    ("has_key", ("missing",), {}),
    ("touch", ("n", 100), {}),
    ("touch", ("missing", 100), {}),
    ("touch", ("n",), {"timeout": None}),
    ("delete", ("n",), {}),
    ("delete", ("n",), {}),
    ("delete_many", (["s", "missing"],), {}),
    ("get_or_set", ("t", "other"), {}),
    ("get_or_set", ("s", "filled"), {}),
    ("get_or_set", ("s", "not again"), {}),
    ("get_or_set", ("n", None), {}),
    ("get_or_set", ("c", "vanishes"), {"timeout": 0}),
    # versions
    ("set", ("a", "v2"), {"version": 2}),
    ("get", ("a",), {"version": 2}),
    ("get", ("a",), {"version": 1}),
    ("add", ("a", "v3"), {"version": 3}),
    ("get_many", (["a", "d"],), {"version": 2}),
    ("set_many", ({"a": "many v4"},), {"version": 4}),
    ("incr_version", ("a",), {"version": 2}),
    ("get", ("a",), {"version": 3}),
    ("decr_version", ("a",), {"version": 4}),
    ("incr_version", ("missing",), {}),
    ("delete", ("a",), {"version": 3}),
    ("has_key", ("a",), {"version": 3}),
    # invalid keys: Django's InvalidCacheKey before any I/O, in every method
    ("get", ("bad key",), {}),
    ("set", ("x" * 251, 1), {}),
    ("add", ("bad\nkey", 1), {}),
    ("delete", ("bad key",), {}),
    ("get_many", (["a", "bad key"],), {}),
    ("set_many", ({"ok": 1, "bad key": 2},), {}),
    ("delete_many", (["d", "bad key"],), {}),
    ("incr", ("bad key",), {}),
    ("touch", ("bad key",), {}),
    ("has_key", ("bad key",), {}),
    ("get_or_set", ("bad key", 1), {}),
    ("get_many", (["d"],), {}),  # delete_many refused the whole call: d is still there
    ("clear", (), {}),
    ("get_many", (["b", "d", 1],), {}),
]


def answer(call: Callable[[], Any]) -> tuple[Any, ...]:
    """What a call answered: its value, or its exception's type and message."""
    try:
        return ("returned", call())
    except Exception as exc:  # every answer is compared, exceptions included
        return ("raised", type(exc), str(exc))


async def aanswer(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("returned", await call())
    except Exception as exc:
        return ("raised", type(exc), str(exc))


def contents(cache: Any) -> dict[Any, Any]:
    return {version: cache.get_many(WATCHED, version=version) for version in (1, 2, 3, 4)}


class AsyncContract(DeploymentSuite):
    """The scenario through both APIs; subclasses provide the ``deployment``."""

    @pytest.fixture(autouse=True)
    def _async_store(self, deployment: Deployment) -> None:
        if (
            deployment.has_servers
            and importlib.util.find_spec("django_mcpatterns.core.aio") is None
        ):
            pytest.skip("the AsyncCluster (django_mcpatterns.core.aio) has not landed yet")

    def caches_setting(self, deployment: Deployment) -> dict[str, dict[str, Any]]:
        return {
            "default": deployment.params(),
            "prefixed": deployment.params(KEY_PREFIX="pre", VERSION=2, TIMEOUT=60),
            "forever": deployment.params(TIMEOUT=None),
        }

    @pytest.mark.parametrize("alias", ["default", "prefixed", "forever"])
    def test_every_async_method_answers_as_its_sync_one(self, alias: str) -> None:
        cache = caches[alias]
        sync_answers = []
        for name, args, kwargs in SCENARIO:
            method = functools.partial(getattr(cache, name), *args, **kwargs)
            sync_answers.append((name, answer(method)))
            sync_answers.append(("contents", contents(cache)))
        cache.clear()

        async def scenario() -> list[tuple[str, Any]]:
            answers = []
            for name, args, kwargs in SCENARIO:
                method = functools.partial(getattr(cache, f"a{name}"), *args, **kwargs)
                answers.append((name, await aanswer(method)))
                answers.append(("contents", contents(cache)))
            return answers

        async_answers = asyncio.run(scenario())
        for step, (expected, got) in enumerate(zip(sync_answers, async_answers, strict=True)):
            assert got == expected, f"step {step // 2}: {SCENARIO[step // 2]}"
        # The scenario means something: it saw hits, misses, refusals and errors.
        kinds = {got[1][0] for got in async_answers if got[0] != "contents"}
        assert kinds == {"returned", "raised"}

    def test_async_forms_are_the_backends_own(self, cache: Any) -> None:
        """Not Django's defaults, which hop to a thread per call (BaseCache.aget...)."""
        from django.core.cache.backends.base import BaseCache

        for name in (
            "aget",
            "aset",
            "aadd",
            "adelete",
            "aget_many",
            "aset_many",
            "adelete_many",
            "aincr",
            "atouch",
            "aget_or_set",
            "aclear",
        ):
            assert getattr(type(cache), name) is not getattr(BaseCache, name), name

    def test_aget_many_is_one_store_call(self, cache: Any) -> None:
        keys = [f"k{i}" for i in range(50)]
        cache.set_many({k: i for i, k in enumerate(keys)})
        calls: list[list[Any]] = []
        store = cache.astore
        original = store.get_many

        async def counting_get_many(made: Any) -> Any:
            calls.append(list(made))
            return await original(made)

        store.get_many = counting_get_many
        try:
            found = asyncio.run(cache.aget_many(keys))
        finally:
            del store.get_many
        assert found == {k: i for i, k in enumerate(keys)}
        assert len(calls) == 1
        assert len(calls[0]) == 50

    def test_concurrent_tasks_share_the_cache_with_threads(self, cache: Any) -> None:
        """Tasks of one loop interleave writes and reads of one counter: none is lost."""
        cache.set("counter", 0)
        rng = random.Random(7)

        async def worker(n: int) -> None:
            for _ in range(20):
                await cache.aincr("counter")
                if rng.random() < 0.5:
                    await asyncio.sleep(0)
                await cache.aset(f"task{n}", n)

        async def run() -> None:
            await asyncio.gather(*(worker(n) for n in range(25)))

        asyncio.run(run())
        assert cache.get("counter") == 500
        assert cache.get_many([f"task{n}" for n in range(25)]) == {f"task{n}": n for n in range(25)}


class TestEmbedded(AsyncContract):
    @pytest.fixture
    def deployment(self) -> Deployment:
        return Deployment.embedded("async-contract")


class TestThreeServers(AsyncContract):
    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3)


class TestTextProtocol(AsyncContract):
    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3, protocol="text")
