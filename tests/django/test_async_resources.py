"""Connections end with their event loop: none is left to the garbage collector.

An ``asyncio.run`` (or asgiref's ``async_to_sync``, which runs one in a thread)
that used the cache and ended without ``aclose`` closes the loop's connections
as it shuts down; ``await cache.aclose()`` closes them at once, natively (Django
6's default ``aclose`` runs ``close`` through ``sync_to_async``).  A
``ResourceWarning`` (``unclosed transport``, ``unclosed <socket>``) would reach
``sys.unraisablehook`` when the collector frees a forgotten connection.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.cache import caches, close_caches

from tests.django.conftest import Deployment, DeploymentSuite


@pytest.fixture
def unraisable(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """What the collector reports during the test (ResourceWarnings made errors, as
    ``-W error::ResourceWarning`` does); earlier tests' garbage is collected first, and
    not judged here (the test harness's server logs, for one)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    seen: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: seen.append(repr(report.exc_value)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        yield seen


class LoopsLeaveNoConnection(DeploymentSuite):
    def test_asyncio_run_without_aclose(self, unraisable: list[str]) -> None:
        cache = caches["default"]

        async def request(n: int) -> Any:
            await cache.aset("k", n)
            return await cache.aget("k")

        assert [asyncio.run(request(n)) for n in range(3)] == [0, 1, 2]
        gc.collect()
        assert unraisable == []

    def test_async_to_sync_and_request_finished(self, unraisable: list[str]) -> None:
        cache = caches["default"]

        async def request() -> Any:
            await cache.aset_many({"a": 1, "b": 2})
            return await cache.aget_many(["a", "b"])

        for _ in range(3):
            assert async_to_sync(request)() == {"a": 1, "b": 2}
            close_caches()  # what Django's request_finished does to every cache
        gc.collect()
        assert unraisable == []

    def test_aclose_closes_this_loops_connections_and_they_reopen(
        self, unraisable: list[str]
    ) -> None:
        cache = caches["default"]

        async def request() -> Any:
            await cache.aset("k", "before")
            await cache.aclose()
            after = await cache.aget("k")
            await cache.aclose()
            return after

        assert asyncio.run(request()) == "before"
        gc.collect()
        assert unraisable == []


class TestEmbedded(LoopsLeaveNoConnection):
    @pytest.fixture
    def deployment(self) -> Deployment:
        return Deployment.embedded("loops")


class TestThreeServers(LoopsLeaveNoConnection):
    @pytest.fixture
    def deployment(self, memcached_3: list[Any]) -> Deployment:
        return Deployment.cluster(memcached_3)
