"""AsyncCluster over TLS (``OPTIONS["tls_context"]``), against memcached started with ``-Z``."""

from __future__ import annotations

import asyncio

import pytest

from django_mcpatterns.core.aio import AsyncCluster
from django_mcpatterns.core.exceptions import NodeUnavailableError
from django_mcpatterns.core.options import ClusterOptions
from tests.drills.tls import Certificate
from tests.harness import MemcachedServer


def test_commands_batches_and_pipelines_work_over_tls(
    tls_server: MemcachedServer, certificate: Certificate
) -> None:
    options = ClusterOptions.from_mapping(
        {"tls_context": certificate.client_context(), "timeout": 2}
    )
    twin = AsyncCluster([tls_server.spec], options)

    async def work() -> None:
        assert await twin.flush_all()
        assert await twin.set("a", {"x": 1})
        assert await twin.set_many({f"k{i}": i for i in range(50)}) == []
        values = await asyncio.gather(*[twin.get(f"k{i}") for i in range(50)])
        assert values == list(range(50))
        assert await twin.get_many(["a", "k3"]) == {"a": {"x": 1}, "k3": 3}
        assert await twin.incr("k7", 5) == 12
        assert await twin.ttl("a") == -1
        await twin.close()

    asyncio.run(work())


def test_a_client_that_does_not_trust_the_server_gets_no_data(
    tls_server: MemcachedServer,
) -> None:
    import ssl

    untrusting = ssl.create_default_context()  # not the test's certificate authority
    options = ClusterOptions.from_mapping({"tls_context": untrusting, "timeout": 2})
    twin = AsyncCluster([tls_server.spec], options)

    async def work() -> None:
        assert await twin.get("a", "miss") == "miss"
        with pytest.raises(NodeUnavailableError):
            await twin.strict().get("a")

    asyncio.run(work())
