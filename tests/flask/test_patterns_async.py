"""The asyncio forms of sets, lists and locks on ``cache.cache`` of the Flask backends.

Flask-Caching's own API stays sync; our backend's pattern methods have their
a-prefixed forms (``asadd``, ``arpush``, ``async with c.lock(...)``) for async
Flask views, with the same Flask conventions as the sync ones: the key prefix,
``0`` never expires, an invalid key raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest

from django_mcpatterns.core.exceptions import InvalidKeyError, LockTimeoutError
from tests.flask.conftest import PREFIX, FlaskDeployment, deployments
from tests.flask.test_patterns import PatternTests

T = TypeVar("T")

deployment = deployments("cluster3", "embedded")


def run(coroutine: Awaitable[T]) -> T:
    async def main() -> T:
        return await coroutine

    return asyncio.run(main())


class TestAsyncPatterns(PatternTests):
    methods = ("asadd", "asmembers", "arpush", "alrange", "lock")

    def test_sets_and_lists_round_trip_under_the_prefix(
        self, c: Any, deployment: FlaskDeployment
    ) -> None:
        async def scenario() -> None:
            assert await c.asadd("tags", "a", "b", 3, b"raw") == 4
            await c.asrem("tags", "a")
            assert await c.asmembers("tags") == {"b", 3, b"raw"}
            assert await c.asismember("tags", 3) is True
            assert await c.arpush("log", "x", "y", timeout=0) == 2
            assert await c.alrange("log", 0, -1) == ["x", "y"]

        run(scenario())
        assert c.smembers("tags") == {"b", 3, b"raw"}  # the sync form reads the same item
        assert self.stored(c, deployment, "tags")
        if deployment.has_servers:
            assert deployment.ttl(PREFIX + "log") == -1  # Flask's 0: never expires

    def test_invalid_keys_raise(self, c: Any) -> None:
        with pytest.raises(InvalidKeyError):
            run(c.asadd("has space", "a"))

    def test_async_with_lock(self, c: Any, deployment: FlaskDeployment) -> None:
        async def scenario() -> None:
            async with c.lock("nightly-report", timeout=10) as lock:
                assert await lock.aowned()
                assert self.stored(c, deployment, "nightly-report")
                with pytest.raises(LockTimeoutError):
                    async with c.lock("nightly-report", blocking_timeout=0.05):
                        pass  # pragma: no cover
            assert not await c.lock("nightly-report").alocked()

        run(scenario())
